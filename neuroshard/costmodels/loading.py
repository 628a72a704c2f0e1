"""Which cost models a search uses: a checkpoint named by the user (``--cost-model``), this
machine's own (``neuroshard pretrain --here``, kept per hardware fingerprint), the shipped CPU
checkpoint, or the unfitted analytic models."""
from __future__ import annotations

import logging
from pathlib import Path

from ..constants import MEASURED_BATCH_SIZE, SHIPPED_CHECKPOINTS
from ..errors import NeuroShardError
from .analytic import AnalyticCommModel, AnalyticComputeModel
from .base import CostModels
from .samples.store import MACHINE_MODEL_FILE, this_machine_file

log = logging.getLogger(__name__)

#: the checkpoint shipped with the package, pre-trained on CPU measurements
DEFAULT_CHECKPOINT = SHIPPED_CHECKPOINTS / "cpu-default.pt"


def analytic_cost_models(batch_size: int | None = None) -> CostModels:
    """The analytic compute and communication models with their default (unfitted) constants."""
    batch_size = int(batch_size or MEASURED_BATCH_SIZE)
    return CostModels(AnalyticComputeModel(batch_size), AnalyticCommModel(batch_size), batch_size,
                      hardware={"note": "unfitted analytic defaults"}, name="analytic-defaults")


def this_machine_models() -> CostModels | None:
    """The cost models pre-trained on this machine (``neuroshard pretrain --here``), named "this
    machine (<fingerprint id>)"; None when this machine's folder has none (or an unreadable
    one: a warning, then None)."""
    path = this_machine_file(MACHINE_MODEL_FILE)
    if path is None:
        return None
    try:
        models = CostModels.load(path)
    except NeuroShardError as exc:
        log.warning("ignoring this machine's cost models %s (%s); rerun `neuroshard pretrain --here`", path, exc)
        return None
    models.name = this_machine_name(path.parent.name)
    return models


def this_machine_name(fingerprint_id: str) -> str:
    """What plans and estimates call the models pre-trained on this machine."""
    return f"this machine ({fingerprint_id[:8]})"


def load_cost_models(path: str | Path | None = None) -> CostModels:
    """Cost models from ``path``; with no path, this machine's own when it was pre-trained here
    (``this_machine_models``), else the shipped checkpoint if present, else the unfitted
    analytic models (with a warning). Raises NeuroShardError for a bad file named by ``path``."""
    if path is not None:
        return CostModels.load(path)
    here = this_machine_models()
    if here is not None:
        return here
    if DEFAULT_CHECKPOINT.exists():
        return CostModels.load(DEFAULT_CHECKPOINT)
    log.warning("no shipped cost-model checkpoint (%s); using unfitted analytic cost models", DEFAULT_CHECKPOINT)
    return analytic_cost_models()


def resolve_cost_models(cost_models: CostModels | str | Path | None = None) -> CostModels:
    """A ``CostModels`` bundle from a bundle, a checkpoint path, or None (``load_cost_models``'
    default: this machine's own, else the shipped checkpoint)."""
    if isinstance(cost_models, CostModels):
        return cost_models
    if cost_models is None or isinstance(cost_models, (str, Path)):
        return load_cost_models(cost_models)
    raise NeuroShardError(f"cost_models must be a CostModels bundle or a checkpoint path, "
                          f"got {type(cost_models).__name__}")


__all__ = ["load_cost_models", "resolve_cost_models", "analytic_cost_models", "this_machine_models",
           "this_machine_name", "DEFAULT_CHECKPOINT"]
