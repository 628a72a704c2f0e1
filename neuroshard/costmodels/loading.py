"""Which cost models a search uses: the shipped CPU checkpoint, a user's own
(``neuroshard pretrain``), or the unfitted analytic models."""
from __future__ import annotations

import logging
from pathlib import Path

from ..constants import MEASURED_BATCH_SIZE
from ..errors import NeuroShardError
from .analytic import AnalyticCommModel, AnalyticComputeModel
from .base import CostModels
from .checkpoint import SHIPPED_CHECKPOINTS

log = logging.getLogger(__name__)

#: the checkpoint shipped with the package, pre-trained on CPU measurements
DEFAULT_CHECKPOINT = SHIPPED_CHECKPOINTS / "cpu-default.pt"


def analytic_cost_models(batch_size: int | None = None) -> CostModels:
    """The analytic compute and communication models with their default (unfitted) constants."""
    batch_size = int(batch_size or MEASURED_BATCH_SIZE)
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


def resolve_cost_models(cost_models: CostModels | str | Path | None = None) -> CostModels:
    """A ``CostModels`` bundle from a bundle, a checkpoint path, or None (the shipped default)."""
    if isinstance(cost_models, CostModels):
        return cost_models
    if cost_models is None or isinstance(cost_models, (str, Path)):
        return load_cost_models(cost_models)
    raise NeuroShardError(f"cost_models must be a CostModels bundle or a checkpoint path, "
                          f"got {type(cost_models).__name__}")


__all__ = ["load_cost_models", "resolve_cost_models", "analytic_cost_models", "DEFAULT_CHECKPOINT"]
