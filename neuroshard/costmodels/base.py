"""The interface every cost model follows, and the bundle search uses.

Every model has the same verbs (scikit-learn style): ``fit``, ``predict``,
``evaluate`` (see ``metrics``), ``save``/``load`` through ``CostModels``.

* A **compute** model maps a *set* of shards run as one fused kernel on one device
  to its forward+backward time in ms. Input: a list of feature arrays, one
  ``(num_shards, NUM_FEATURES)`` array per set (``features.shard_set_features``).
* A **communication** model maps the per-device all-to-all widths (sum of the
  columns of the shards on each device) of plans with ``num_devices`` devices to
  per-device forward time (which includes waiting for devices that start later:
  ``skews_ms``), backward time, and the time to reduce row-wise partial sums.

Costs are for the batch size the model was measured at (``CostModels.batch_size``);
``CostModels`` scales them linearly to another batch size.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


class ComputeCostModel(ABC):
    """Shard set -> fused forward+backward kernel time (ms)."""

    name = "compute"

    @abstractmethod
    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "ComputeCostModel":
        """Learn from measured shard sets."""

    @abstractmethod
    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """Predicted ms for each shard set (thousands per call)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class CommCostModel(ABC):
    """Per-device all-to-all widths -> per-device communication times (ms)."""

    name = "comm"

    @abstractmethod
    def fit(self, widths: np.ndarray, skews_ms: np.ndarray, fwd_ms: np.ndarray, bwd_ms: np.ndarray,
            reduce_width: np.ndarray, reduce_ms: np.ndarray) -> "CommCostModel":
        """Learn from measurements: arrays of shape (P, D), reduce_* of shape (P,)."""

    @abstractmethod
    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        """(P, D) widths and start skews -> (P, D) forward all-to-all ms, waiting included."""

    @abstractmethod
    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        """(P, D) widths -> (P, D) backward all-to-all ms."""

    @abstractmethod
    def predict_reduce(self, reduce_width: np.ndarray) -> np.ndarray:
        """(P,) columns of row-wise partial sums to reduce -> (P,) ms per device."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class CostModels:
    """What search needs: a compute model and a communication model per device count,
    measured at ``batch_size`` on ``hardware``."""

    compute: ComputeCostModel
    comm: dict[int, CommCostModel]
    batch_size: int
    hardware: dict = field(default_factory=dict)
    name: str = "cost-models"
    metrics: dict = field(default_factory=dict)

    def comm_for(self, num_devices: int) -> CommCostModel:
        """The communication model for ``num_devices`` (the nearest measured count,
        extrapolated, when that count was not measured)."""
        if num_devices in self.comm:
            return self.comm[num_devices]
        nearest = min(self.comm, key=lambda d: (abs(d - num_devices), -d))
        return self.comm[nearest]
