"""Cost models: measurement, neural compute/communication models, checkpoints.

``load_cost_models()`` is what search calls: the shipped CPU checkpoint, or a
user's own (``neuroshard pretrain``), or the unfitted analytic models.
"""
from __future__ import annotations

import logging
from pathlib import Path

from .base import CommAtDevices, CommCostModel, CommSamples, ComputeCostModel, CostModel, CostModels

log = logging.getLogger(__name__)

#: the checkpoint shipped with the package, pre-trained on CPU measurements
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "cpu-default.pt"


def analytic_cost_models(batch_size: int | None = None) -> CostModels:
    """The analytic compute and communication models with their default (unfitted) constants."""
    from .analytic import DEFAULT_BATCH_SIZE, AnalyticCommModel, AnalyticComputeModel
    batch_size = int(batch_size or DEFAULT_BATCH_SIZE)
    return CostModels(AnalyticComputeModel(batch_size), AnalyticCommModel(batch_size), batch_size,
                      hardware={"note": "unfitted analytic defaults"}, name="analytic-defaults")


def load_cost_models(path: str | Path | None = None) -> CostModels:
    """Cost models from ``path``; with no path, the shipped checkpoint if present, else the
    unfitted analytic models (with a warning). Raises NeuroShardError for a bad file."""
    if path is not None:
        return CostModels.load(path)
    if DEFAULT_CHECKPOINT.exists():
        return CostModels.load(DEFAULT_CHECKPOINT)
    log.warning("no shipped cost-model checkpoint (%s); using unfitted analytic cost models", DEFAULT_CHECKPOINT)
    return analytic_cost_models()


__all__ = ["CostModel", "ComputeCostModel", "CommCostModel", "CommSamples", "CommAtDevices", "CostModels",
           "load_cost_models", "analytic_cost_models", "DEFAULT_CHECKPOINT"]
