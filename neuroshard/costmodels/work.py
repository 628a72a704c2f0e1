"""The work model: a device's time, linear in the work its fused kernel does per sample.

``a x lookups x columns + b x shards + c x weight GiB + d`` per shard set (``WORK_FEATURES``;
weight bytes with rows capped at ``row_cap``, as a measured shard allocates them), fitted by
scikit-learn's ``LinearRegression(positive=True)``: more work never costs less. On-site
calibration fits one beside the ensemble's corrections (``EnsembleComputeModel.fit_work_model``).
It predicts worse than the corrected ensemble on random sets, but a search cannot exploit it
the way it exploits the ensemble (a search goes where its model under-predicts), so the same
search against it alone gives one more candidate plan that measurement decides
(``measured.refine``, ``search --calibrate``; ``ensemble.work_cost_models``). Measured effect:
``docs/decisions.md#work-model``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..constants import DEFAULT_MAX_ROWS
from ..errors import NeuroShardError
from .base import ComputeCostModel, register_model
from .features import FEATURE_NAMES, capped_weight_bytes

#: the regressors per set: lookups x columns per sample, shards, weight GiB (rows capped)
WORK_FEATURES = ("lookups_x_columns", "shards", "weight_gib")


def work_features(sets: Sequence[np.ndarray], row_cap: int) -> np.ndarray:
    """(sets, 3): ``WORK_FEATURES`` of each set of shard features (rows capped at ``row_cap``)."""
    dim_col, pool_col = FEATURE_NAMES.index("dim"), FEATURE_NAMES.index("pooling_factor")
    out = np.zeros((len(sets), len(WORK_FEATURES)))
    for k, s in enumerate(sets):
        s = np.asarray(s, dtype=np.float64).reshape(len(s), -1)
        out[k] = ((s[:, pool_col] * s[:, dim_col]).sum(), len(s), capped_weight_bytes(s, row_cap) / 2**30)
    return out


@register_model
class WorkComputeModel(ComputeCostModel):
    """Linear in ``WORK_FEATURES`` with non-negative coefficients (fitted: ``coef_``, ``intercept_``)."""

    name = "work"

    def __init__(self, row_cap: int = DEFAULT_MAX_ROWS):
        self.row_cap = row_cap

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "WorkComputeModel":
        from sklearn.linear_model import LinearRegression
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        keep = costs_ms > 0
        if keep.sum() < len(WORK_FEATURES) + 1:
            raise NeuroShardError(f"the work model needs at least {len(WORK_FEATURES) + 1} measured sets, "
                                  f"got {int(keep.sum())}")
        fit = LinearRegression(positive=True).fit(work_features([s for s, k in zip(sets, keep) if k], self.row_cap),
                                                   costs_ms[keep])
        self.coef_ = [float(c) for c in fit.coef_]
        self.intercept_ = float(fit.intercept_)
        return self

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        if getattr(self, "coef_", None) is None:
            raise NeuroShardError("the work model is not fitted; call fit or load a checkpoint")
        if not len(sets):
            return np.zeros(0)
        return np.maximum(work_features(sets, self.row_cap) @ np.asarray(self.coef_) + self.intercept_, 1e-6)

    def fitted_state(self) -> dict:
        if getattr(self, "coef_", None) is None:
            return {}
        return {"coef": list(self.coef_), "intercept": self.intercept_}

    def load_fitted_state(self, state: dict) -> None:
        if "coef" not in state:
            return
        coef = state["coef"]
        if len(coef) != len(WORK_FEATURES) or "intercept" not in state or min(coef) < 0:
            raise ValueError(f"the work model needs {len(WORK_FEATURES)} non-negative coefficients and an intercept")
        self.coef_ = [float(c) for c in coef]
        self.intercept_ = float(state["intercept"])
