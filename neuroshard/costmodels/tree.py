"""Reference models: gradient-boosted trees (scikit-learn) on aggregated features.

A tree model sees no sets, so a shard set becomes one fixed vector: the number of
shards, and the sum, max and mean of each per-shard input (``neural.shard_inputs``).
Communication trees see the same per-device inputs as the neural model. Both predict
log ms. Fitted trees are kept as arrays (``TreeArrays``: split feature, threshold,
children and leaf values of every node), so checkpoints hold data, not pickled code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn, Sequence

import numpy as np
import torch
from sklearn.ensemble import HistGradientBoostingRegressor

from ..constants import MEASURED_BATCH_SIZE
from ..errors import NeuroShardError
from .base import (
    CommCostModel,
    CommSamples,
    ComputeCostModel,
    as_comm_groups,
    few_threads,
    pack_sets,
    register_model,
    set_sums,
)
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


@dataclass
class TreeArrays:
    """Fitted gradient-boosted trees as arrays, one entry per node of all trees: a sample goes
    to ``left`` where its ``feature`` is <= ``threshold`` (or is NaN and ``missing_left``), else
    ``right``, until a leaf; the prediction is ``baseline`` plus the leaves' ``value``s.
    Children are indices into these arrays; ``roots`` holds each tree's first node."""

    baseline: float
    roots: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf: np.ndarray
    value: np.ndarray

    FIELDS = ("roots", "feature", "threshold", "missing_left", "left", "right", "leaf", "value")

    @classmethod
    def from_sklearn(cls, model: HistGradientBoostingRegressor) -> "TreeArrays":
        """The trees of a fitted regressor (numeric features, one tree per iteration), read from its
        fitted predictors (``_predictors``, ``_baseline_prediction``: the tests compare with its ``predict``)."""
        trees = [predictors[0].nodes for predictors in model._predictors]
        if any(t["is_categorical"].any() for t in trees):
            raise NeuroShardError("tree models take numeric features only")
        sizes = np.array([len(t) for t in trees], dtype=np.int64)
        roots = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        nodes = np.concatenate(trees)
        offset = np.repeat(roots, sizes)
        return cls(float(np.ravel(model._baseline_prediction)[0]), roots, nodes["feature_idx"].astype(np.int64),
                   nodes["num_threshold"].astype(np.float64), nodes["missing_go_to_left"].astype(bool),
                   nodes["left"].astype(np.int64) + offset, nodes["right"].astype(np.int64) + offset,
                   nodes["is_leaf"].astype(bool), nodes["value"].astype(np.float64))

    def predict(self, x: np.ndarray, chunk: int = 2048) -> np.ndarray:
        """Predictions for the rows of ``x``: every tree walked at once, one level per step."""
        x = np.asarray(x, dtype=np.float64)
        out = np.empty(len(x))
        for start in range(0, len(x), chunk):
            rows = x[start:start + chunk]
            node = np.broadcast_to(self.roots, (len(rows), len(self.roots))).copy()
            sample = np.arange(len(rows))[:, None]
            for _ in range(len(self.leaf) + 1):  # no path is longer than the nodes
                inner = ~self.leaf[node]
                if not inner.any():
                    break
                values = rows[sample, self.feature[node]]
                go_left = (values <= self.threshold[node]) | (np.isnan(values) & self.missing_left[node])
                node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
            else:
                raise NeuroShardError("tree arrays with a cycle: not trees")
            out[start:start + chunk] = self.baseline + self.value[node].sum(axis=1)
        return out

    def state_dict(self) -> dict:
        return {"baseline": self.baseline, **{name: torch.from_numpy(getattr(self, name)) for name in self.FIELDS}}

    @classmethod
    def from_state_dict(cls, state: dict) -> "TreeArrays":
        arrays = {name: torch.as_tensor(state[name]).numpy() for name in cls.FIELDS}
        size = len(arrays["feature"])
        if any(len(a) != size for n, a in arrays.items() if n != "roots") or not len(arrays["roots"]):
            raise ValueError("tree arrays of unequal lengths")
        for name in ("roots", "left", "right"):
            if size and (arrays[name].min() < 0 or arrays[name].max() >= size):
                raise ValueError(f"'{name}' points outside the {size} nodes")
        if size and arrays["feature"].min() < 0:
            raise ValueError("'feature' holds a negative index")
        return cls(float(state["baseline"]), **arrays)


def _fitted_trees(seed: int, params: dict, x: np.ndarray, y: np.ndarray) -> TreeArrays:
    """Gradient-boosted trees fitted on (x, y) with scikit-learn, as arrays."""
    model = HistGradientBoostingRegressor(early_stopping=True, validation_fraction=0.15, n_iter_no_change=30,
                                          random_state=seed, **params)
    with few_threads():
        return TreeArrays.from_sklearn(model.fit(x, y))


def _refuse_pickled(name: str) -> NoReturn:
    raise NeuroShardError(f"a {name} of checkpoint format v1 holds pickled scikit-learn trees (code, not data) and "
                          f"is not loaded; fit it again (`neuroshard pretrain`) to store its trees as arrays")


class _Boosting:
    """The hyper-parameters of scikit-learn's ``HistGradientBoostingRegressor`` both tree models take."""

    def __init__(self, seed: int = 0, max_iter: int = 600, learning_rate: float = 0.05, max_leaf_nodes: int = 31,
                 min_samples_leaf: int = 10, l2_regularization: float = 1e-3):
        self.seed = seed
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization

    def boosting_params(self) -> dict:
        return dict(max_iter=self.max_iter, learning_rate=self.learning_rate, max_leaf_nodes=self.max_leaf_nodes,
                    min_samples_leaf=self.min_samples_leaf, l2_regularization=self.l2_regularization)


@register_model
class TreeComputeModel(_Boosting, ComputeCostModel):
    """Shard set -> ms with gradient-boosted trees on set aggregates (fitted: ``trees_``)."""

    name = "tree"

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "TreeComputeModel":
        self.trees_ = _fitted_trees(self.seed, self.boosting_params(), set_aggregates(sets),
                                    np.log(np.asarray(costs_ms)))
        return self

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        if not hasattr(self, "trees_"):
            raise NeuroShardError("the tree compute model is not trained; call fit or load a checkpoint")
        return np.exp(self.trees_.predict(set_aggregates(sets)))

    def fitted_state(self) -> dict:
        return {"trees": self.trees_.state_dict()} if hasattr(self, "trees_") else {}

    def load_fitted_state(self, state: dict) -> None:
        self.trees_ = TreeArrays.from_state_dict(state["trees"])

    @classmethod
    def upgrade_v1(cls, state: dict) -> dict:
        return _refuse_pickled(cls.__name__)


@register_model
class TreeCommModel(_Boosting, CommCostModel):
    """Per-device communication ms with gradient-boosted trees, one per direction measured
    (fitted: ``trees_``, direction -> ``TreeArrays``)."""

    name = "tree"

    def __init__(self, batch_size: int = MEASURED_BATCH_SIZE, seed: int = 0, max_iter: int = 600, learning_rate: float = 0.05,
                 max_leaf_nodes: int = 31, min_samples_leaf: int = 10, l2_regularization: float = 1e-3):
        super().__init__(seed, max_iter, learning_rate, max_leaf_nodes, min_samples_leaf, l2_regularization)
        self.batch_size = batch_size

    def fit(self, samples: CommSamples | Sequence[CommSamples]) -> "TreeCommModel":
        groups = as_comm_groups(samples)
        b = self.batch_size
        fwd = [(device_inputs(g.widths, g.skews_ms, b), g.fwd_ms) for g in groups]
        bwd = [(device_inputs(g.widths, None, b), g.bwd_ms) for g in groups]
        red = [(reduce_inputs(r.reduce_width, r.num_devices, b), r.reduce_ms_per_sample) for r in map(CommSamples.reducing, groups)]
        self.trees_ = {}
        for direction, pairs in (("fwd", fwd), ("bwd", bwd), ("reduce", red)):
            if sum(len(p[1]) for p in pairs) < 4:  # no row-wise reduction measured
                continue
            z = np.concatenate([p[0].reshape(-1, p[0].shape[-1]) for p in pairs])
            y = np.log(np.maximum(np.concatenate([p[1].ravel() for p in pairs]), 1e-6))
            self.trees_[direction] = _fitted_trees(self.seed, self.boosting_params(), z, y)
        return self

    def _predict(self, direction: str, z: np.ndarray) -> np.ndarray:
        if direction not in getattr(self, "trees_", {}):
            raise NeuroShardError(f"the tree comm model has no measurements of direction {direction!r}")
        return np.exp(self.trees_[direction].predict(z.reshape(-1, z.shape[-1]))).reshape(z.shape[:-1])

    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        return self._predict("fwd", device_inputs(widths, skews_ms, self.batch_size))

    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        return self._predict("bwd", device_inputs(widths, None, self.batch_size))

    def predict_reduce(self, reduce_width: np.ndarray, num_devices: int) -> np.ndarray:
        reduce_width = np.asarray(reduce_width, dtype=np.float64)
        return self._predict("reduce", reduce_inputs(reduce_width, num_devices, self.batch_size)) * (reduce_width > 0)

    def fitted_state(self) -> dict:
        return {"trees": {d: t.state_dict() for d, t in self.trees_.items()}} if hasattr(self, "trees_") else {}

    def load_fitted_state(self, state: dict) -> None:
        self.trees_ = {d: TreeArrays.from_state_dict(t) for d, t in state["trees"].items()}

    @classmethod
    def upgrade_v1(cls, state: dict) -> dict:
        return _refuse_pickled(cls.__name__)
