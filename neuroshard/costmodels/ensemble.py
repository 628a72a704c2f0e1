"""An ensemble of neural compute models: a prediction and an honest spread.

A deep ensemble (Lakshminarayanan et al., 2017): ``size`` neural compute models with
the same recipe, each trained from another seed on a bootstrap resample of the sets.
Where the measurements cover a shard set the members agree; on sets unlike any they
were trained on they drift apart. ``predict`` is their geometric mean, ``spread``
the standard deviation of their log predictions (about the relative error one should
expect there).

The search uses the spread so that it does not exploit model error
(``Simulator(risk=)``): a device set is charged ``mean x exp(risk x spread)``, so a
plan wins only where it is better by more than the models disagree.

**Set-size correction** (``fit_set_size_correction``, fitted by on-site calibration):
the members pool per-shard encodings, and the pre-training data had few shards per set,
so they learnt the fused kernel's amortisation but not its crowding: measured on this
project's CPU, one device's cost per table falls to about 10 tables, then rises again
(``experiments/results/grouping_effect/count_curve.md``), while the model's keeps
falling. The correction multiplies the mean by ``exp(c . phi(n))``, ``n`` the shards of
the set, ``phi`` piecewise linear in ``log n`` (knots ``SET_SIZE_KNOTS``), ``c`` the
ridge least-squares fit of ``log(measured / predicted)`` on the calibration's sets.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import NeuroShardError
from .base import ComputeCostModel
from .neural import NeuralComputeModel

#: shards per set where the set-size correction may bend (piecewise linear in log n between them)
SET_SIZE_KNOTS = (4.0, 16.0)
#: ridge penalty of the set-size correction's slopes (its level is not penalised)
SET_SIZE_RIDGE = 1e-2


def set_size_basis(sizes: np.ndarray) -> np.ndarray:
    """(sets, 2 + knots): 1, log n, and a hinge max(0, log n - log k) per knot."""
    log_n = np.log(np.maximum(np.asarray(sizes, dtype=np.float64), 1.0))
    return np.column_stack([np.ones_like(log_n), log_n] + [np.maximum(0.0, log_n - np.log(k)) for k in SET_SIZE_KNOTS])


class EnsembleComputeModel(ComputeCostModel):
    """``size`` ``NeuralComputeModel(**member_params)`` on bootstrap resamples (fitted: ``members_``)."""

    name = "ensemble"

    def __init__(self, size: int = 5, bootstrap: bool = True, seed: int = 0, member_params: dict | None = None):
        self.size = size
        self.bootstrap = bootstrap
        self.seed = seed
        self.member_params = member_params

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray] | None = None,
            val_costs_ms: np.ndarray | None = None) -> "EnsembleComputeModel":
        if not isinstance(self.size, int) or self.size < 2:
            raise NeuroShardError(f"an ensemble needs at least 2 members, got {self.size!r}")
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        params = dict(self.member_params or {})
        base_seed = int(params.pop("seed", self.seed))
        self.members_ = []
        for k in range(self.size):
            rng = np.random.default_rng([self.seed, k])
            rows = rng.integers(0, len(sets), len(sets)) if self.bootstrap else np.arange(len(sets))
            member = NeuralComputeModel(**params, seed=base_seed + k)
            self.members_.append(member.fit([sets[i] for i in rows], costs_ms[rows], val_sets, val_costs_ms))
        return self

    def fine_tune(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray],
                  val_costs_ms: np.ndarray, **kwargs: Any) -> "EnsembleComputeModel":
        """Fine-tune every member on the same new measurements (on-site calibration)."""
        self._check()
        self.set_size_coef_ = None  # the members change: a correction fitted before no longer applies
        for member in self.members_:
            member.fine_tune(sets, costs_ms, val_sets, val_costs_ms, **kwargs)
        return self

    def fit_set_size_correction(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "EnsembleComputeModel":
        """Fit the set-size correction on measured sets (see the module docstring)."""
        self._check()
        self.set_size_coef_ = None
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        keep = costs_ms > 0
        sets = [s for s, k in zip(sets, keep) if k]
        residual = np.log(costs_ms[keep]) - np.log(np.maximum(self.predict(sets), 1e-9))
        basis = set_size_basis(np.array([len(s) for s in sets]))
        penalty = SET_SIZE_RIDGE * np.eye(basis.shape[1])
        penalty[0, 0] = 0.0
        coef = np.linalg.solve(basis.T @ basis + len(sets) * penalty, basis.T @ residual)
        self.set_size_coef_ = [float(c) for c in coef]
        return self

    def _check(self) -> None:
        if not getattr(self, "members_", None):
            raise NeuroShardError("the ensemble compute model is not trained; call fit or load a checkpoint")

    def predict_members(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """(members, sets) predicted ms."""
        self._check()
        return np.stack([m.predict(sets) for m in self.members_])

    def predict_with_spread(self, sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(geometric-mean ms, standard deviation of the members' log ms) of each set."""
        logs = np.log(np.maximum(self.predict_members(sets), 1e-9))
        mean = logs.mean(axis=0)
        if getattr(self, "set_size_coef_", None) is not None:
            mean = mean + set_size_basis(np.array([len(s) for s in sets])) @ np.asarray(self.set_size_coef_)
        return np.exp(mean), logs.std(axis=0)

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[0]

    def spread(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[1]

    def fitted_state(self) -> dict:
        if not getattr(self, "members_", None):
            return {}
        state = {"members": [m.state_dict() for m in self.members_]}
        if getattr(self, "set_size_coef_", None) is not None:  # absent in checkpoints without one
            state["set_size_coef"] = list(self.set_size_coef_)
        return state

    def load_fitted_state(self, state: dict) -> None:
        self.members_ = [NeuralComputeModel.from_state_dict(m) for m in state["members"]]
        coef = state.get("set_size_coef")
        if coef is not None and len(coef) != 2 + len(SET_SIZE_KNOTS):
            raise ValueError(f"set_size_coef has {len(coef)} values, expected {2 + len(SET_SIZE_KNOTS)}")
        self.set_size_coef_ = None if coef is None else [float(c) for c in coef]
        if len(self.members_) != self.size:
            raise ValueError(f"{len(self.members_)} members stored for an ensemble of {self.size}")
