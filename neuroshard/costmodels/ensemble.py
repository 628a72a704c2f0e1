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
    """``size`` ``NeuralComputeModel``s (hyper-parameters ``member_params``) on bootstrap resamples."""

    name = "ensemble"

    def __init__(self, size: int = 5, bootstrap: bool = True, seed: int = 0, **member_params: Any):
        if not isinstance(size, int) or size < 2:
            raise NeuroShardError(f"an ensemble needs at least 2 members, got {size!r}")
        self.size, self.bootstrap, self.seed = size, bootstrap, seed
        self.member_params = dict(member_params)
        self.members: list[NeuralComputeModel] = []

    @property
    def hparams(self) -> dict:
        return {"size": self.size, "bootstrap": self.bootstrap, "seed": self.seed, **self.member_params}

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray] | None = None,
            val_costs_ms: np.ndarray | None = None) -> "EnsembleComputeModel":
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        self.members = []
        for k in range(self.size):
            rng = np.random.default_rng([self.seed, k])
            rows = rng.integers(0, len(sets), len(sets)) if self.bootstrap else np.arange(len(sets))
            params = {**self.member_params, "seed": int(self.member_params.get("seed", self.seed)) + k}
            member = NeuralComputeModel(**params)
            self.members.append(member.fit([sets[i] for i in rows], costs_ms[rows], val_sets, val_costs_ms))
        return self

    def fine_tune(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray],
                  val_costs_ms: np.ndarray, **kwargs: Any) -> "EnsembleComputeModel":
        """Fine-tune every member on the same new measurements (on-site calibration)."""
        self._check()
        for member in self.members:
            member.fine_tune(sets, costs_ms, val_sets, val_costs_ms, **kwargs)
        return self

    def _check(self) -> None:
        if not self.members:
            raise NeuroShardError("the ensemble compute model is not trained; call fit or load a checkpoint")

    def predict_members(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """(members, sets) predicted ms."""
        self._check()
        return np.stack([m.predict(sets) for m in self.members])

    def predict_with_spread(self, sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(geometric-mean ms, standard deviation of the members' log ms) of each set."""
        logs = np.log(np.maximum(self.predict_members(sets), 1e-9))
        return np.exp(logs.mean(axis=0)), logs.std(axis=0)

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[0]

    def spread(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[1]

    def state_dict(self) -> dict:
        return {"hparams": self.hparams, "members": [m.state_dict() for m in self.members]}

    def load_state_dict(self, state: dict) -> None:
        params = dict(state["hparams"])
        self.size, self.bootstrap, self.seed = int(params.pop("size")), bool(params.pop("bootstrap")), params.pop("seed")
        self.member_params = params
        self.members = []
        for member_state in state["members"]:
            member = NeuralComputeModel()
            member.load_state_dict(member_state)
            self.members.append(member)
        if len(self.members) != self.size:
            raise ValueError(f"{len(self.members)} members stored for an ensemble of {self.size}")
