"""Reference models: gradient-boosted trees (scikit-learn) on aggregated features.

A tree model sees no sets, so a shard set becomes one fixed vector: the number of
shards, and the sum, max and mean of each per-shard input (``neural.shard_inputs``).
Communication trees see the same per-device inputs as the neural model. Both predict
log ms. Checkpoints hold the fitted estimators pickled into a byte tensor (load only
checkpoints you trust, as with any pickle).
"""
from __future__ import annotations

import pickle
from typing import Sequence

import numpy as np
import torch
from sklearn.ensemble import HistGradientBoostingRegressor

from ..errors import NeuroShardError
from .base import CommCostModel, CommSamples, ComputeCostModel, as_comm_groups, few_threads, pack_sets, set_sums
from .neural import device_inputs, reduce_inputs, shard_inputs


def set_aggregates(sets: Sequence[np.ndarray]) -> np.ndarray:
    """(num_sets, 1 + 3 K): shard count, then sum, max and mean of each per-shard input."""
    shards, index, num_sets = pack_sets(sets)
    x = shard_inputs(shards).astype(np.float64)
    count = np.bincount(index, minlength=num_sets).astype(np.float64)
    sums = set_sums(x, index, num_sets)
    maxes = np.full((num_sets, x.shape[1]), -np.inf)
    np.maximum.at(maxes, index, x)
    maxes[count == 0] = 0.0
    return np.column_stack([count, sums, maxes, sums / np.maximum(count, 1)[:, None]])


def _regressor(seed: int, **params) -> HistGradientBoostingRegressor:
    defaults = dict(max_iter=600, learning_rate=0.05, max_leaf_nodes=31, min_samples_leaf=10, l2_regularization=1e-3,
                    early_stopping=True, validation_fraction=0.15, n_iter_no_change=30, random_state=seed)
    defaults.update(params)
    return HistGradientBoostingRegressor(**defaults)


def _pickled(obj) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _unpickled(tensor: torch.Tensor):
    return pickle.loads(tensor.numpy().tobytes())


class TreeComputeModel(ComputeCostModel):
    """Shard set -> ms with gradient-boosted trees on set aggregates."""

    name = "tree"

    def __init__(self, seed: int = 0, **params):
        self.seed, self.params = seed, params
        self.model: HistGradientBoostingRegressor | None = None

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "TreeComputeModel":
        with few_threads():
            self.model = _regressor(self.seed, **self.params).fit(set_aggregates(sets), np.log(np.asarray(costs_ms)))
        return self

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        with few_threads():
            return np.exp(self.model.predict(set_aggregates(sets)))

    def state_dict(self) -> dict:
        return {"seed": self.seed, "params": dict(self.params), "model": _pickled(self.model)}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.params = int(state["seed"]), dict(state["params"])
        self.model = _unpickled(state["model"])


class TreeCommModel(CommCostModel):
    """Per-device communication ms with gradient-boosted trees, one per direction."""

    name = "tree"

    def __init__(self, batch_size: int = 4096, seed: int = 0):
        self.batch_size, self.seed = int(batch_size), seed
        self.models: dict = {}

    def fit(self, samples: CommSamples | Sequence[CommSamples]) -> "TreeCommModel":
        groups = as_comm_groups(samples)
        b = self.batch_size
        fwd = [(device_inputs(g.widths, g.skews_ms, b), g.fwd_ms) for g in groups]
        bwd = [(device_inputs(g.widths, None, b), g.bwd_ms) for g in groups]
        red = [(reduce_inputs(r.reduce_width, r.num_devices, b), r.reduce_ms_per_sample) for r in map(CommSamples.reducing, groups)]
        for direction, pairs in (("fwd", fwd), ("bwd", bwd), ("reduce", red)):
            if sum(len(p[1]) for p in pairs) < 4:  # no row-wise reduction measured
                continue
            z = np.concatenate([p[0].reshape(-1, p[0].shape[-1]) for p in pairs])
            y = np.log(np.maximum(np.concatenate([p[1].ravel() for p in pairs]), 1e-6))
            with few_threads():
                self.models[direction] = _regressor(self.seed).fit(z, y)
        return self

    def _predict(self, direction: str, z: np.ndarray) -> np.ndarray:
        if direction not in self.models:
            raise NeuroShardError(f"the tree comm model has no measurements of direction {direction!r}")
        with few_threads():
            return np.exp(self.models[direction].predict(z.reshape(-1, z.shape[-1]))).reshape(z.shape[:-1])

    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        return self._predict("fwd", device_inputs(widths, skews_ms, self.batch_size))

    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        return self._predict("bwd", device_inputs(widths, None, self.batch_size))

    def predict_reduce(self, reduce_width: np.ndarray, num_devices: int) -> np.ndarray:
        reduce_width = np.asarray(reduce_width, dtype=np.float64)
        return self._predict("reduce", reduce_inputs(reduce_width, num_devices, self.batch_size)) * (reduce_width > 0)

    def state_dict(self) -> dict:
        return {"batch_size": self.batch_size, "seed": self.seed, "models": _pickled(self.models)}

    def load_state_dict(self, state: dict) -> None:
        self.batch_size, self.seed = int(state["batch_size"]), int(state["seed"])
        self.models = _unpickled(state["models"])
