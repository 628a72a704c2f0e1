"""Cost models: measurement, neural compute/communication models, checkpoints.

``load_cost_models()`` is what search calls: a user's own checkpoint when one is named
(``--cost-model``, or a path as ``shard(cost_models=...)``; fitted by ``neuroshard pretrain``); else this
machine's own models when it was pre-trained here (``neuroshard pretrain --here``, the folder of
this machine's fingerprint); else the shipped CPU checkpoint; else, with a warning, the unfitted
analytic models.

Importing this package imports none of its modules (scikit-learn, torch): each name
below is loaded from its module on first use (``neuroshard.on_first_use``).
"""
from ..on_first_use import on_first_use

_ON_FIRST_USE = {
    "load_cost_models": "loading", "resolve_cost_models": "loading", "analytic_cost_models": "loading",
    "DEFAULT_CHECKPOINT": "loading",
    "CostModel": "base", "ComputeCostModel": "base", "CommCostModel": "base", "CommSamples": "base",
    "CommAtDevices": "base", "CostModels": "base",
}
__getattr__, __dir__ = on_first_use(__name__, _ON_FIRST_USE)

__all__ = sorted(_ON_FIRST_USE)
