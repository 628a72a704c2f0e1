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
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import NeuroShardError
from .base import ComputeCostModel
from .neural import NeuralComputeModel


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
        for member in self.members_:
            member.fine_tune(sets, costs_ms, val_sets, val_costs_ms, **kwargs)
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
        return np.exp(logs.mean(axis=0)), logs.std(axis=0)

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[0]

    def spread(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[1]

    def fitted_state(self) -> dict:
        return {"members": [m.state_dict() for m in self.members_]} if getattr(self, "members_", None) else {}

    def load_fitted_state(self, state: dict) -> None:
        self.members_ = [NeuralComputeModel.from_state_dict(m) for m in state["members"]]
        if len(self.members_) != self.size:
            raise ValueError(f"{len(self.members_)} members stored for an ensemble of {self.size}")
