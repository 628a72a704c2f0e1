"""The interface every cost model follows, and the bundle search uses.

Every model is a scikit-learn estimator (``CostModel``): hyper-parameters are the
constructor's arguments (``get_params``, ``sklearn.base.clone``), ``fit`` sets the
fitted state (attributes ending in ``_``), and the verbs are the same for all:
``fit``, ``predict``, ``evaluate`` (see ``metrics``), ``save``/``load`` through
``CostModels``. A class that checkpoints save registers itself with the class decorator
``register_model`` (``checkpoint``), in the module that defines it.

* A **compute** model maps a *set* of shards run as one fused kernel on one device
  to its forward+backward time in ms. Input: a list of feature arrays, one
  ``(num_shards, NUM_FEATURES)`` array per set (``features.shard_set_features``).
* A **communication** model maps the per-device all-to-all widths (sum of the
  columns of the shards on each device) of plans with ``num_devices`` devices to
  per-device forward time (which includes waiting for devices that start later:
  ``skews_ms``), backward time, and the time to reduce row-wise partial sums.
  One model serves every device count: ``num_devices`` is the width of the
  ``(P, D)`` arrays (and an argument of ``predict_reduce``), and the formulas
  scale with it, so a model measured on 2-4 devices answers for 128.

Costs are for the batch size the model was measured at (``CostModels.batch_size``);
``CostModels.scale`` turns them into another batch size (linearly).
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from sklearn.base import BaseEstimator

from ..errors import NeuroShardError
from ..tables import Table
from . import checkpoint
from .checkpoint import register_model  # noqa: F401 (re-exported: model classes register through base)
from .features import shard_set_features
from .metrics import comm_metrics, cost_metrics


@contextlib.contextmanager
def few_threads(num_threads: int = 1) -> Iterator[None]:
    """Run torch and OpenMP/BLAS code (scikit-learn's trees) on ``num_threads`` threads, restoring the
    previous settings after. The models are small: extra threads only add synchronisation, which on a
    shared machine costs far more than it saves."""
    import torch
    from threadpoolctl import threadpool_limits
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        with threadpool_limits(num_threads):
            yield
    finally:
        torch.set_num_threads(previous)


# ----------------------------------------------------------------- shard sets
def pack_sets(sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Concatenate shard sets: (all shards ``(N, F)`` float32, set index of each shard ``(N,)``,
    number of sets). Empty sets are allowed (they own no rows)."""
    sizes = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
    if sizes.sum() == 0:
        width = sets[0].shape[1] if len(sets) and np.ndim(sets[0]) == 2 else 0
        return np.zeros((0, width), np.float32), np.zeros(0, np.int64), len(sets)
    shards = np.concatenate([np.asarray(s, dtype=np.float32) for s in sets if len(s)], axis=0)
    return shards, np.repeat(np.arange(len(sets)), sizes), len(sets)


def set_sums(values: np.ndarray, index: np.ndarray, num_sets: int) -> np.ndarray:
    """Sum per set of per-shard ``values`` (``(N,)`` or ``(N, K)``)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        return np.bincount(index, weights=values, minlength=num_sets)
    out = np.zeros((num_sets, values.shape[1]))
    np.add.at(out, index, values)
    return out


# ---------------------------------------------------------------- comm samples
def reduce_time_ms(per_device_ms: np.ndarray) -> np.ndarray:
    """(P,) one reduction time per sample from (P, D) per-device times: their mean."""
    return np.asarray(per_device_ms, dtype=np.float64).mean(axis=1)


@dataclass
class CommSamples:
    """Measured all-to-all samples at one device count ``D``: ``widths``, ``skews_ms``,
    ``fwd_ms``, ``bwd_ms``, ``reduce_ms`` of shape (P, D); ``reduce_width`` of shape (P,)."""

    widths: np.ndarray
    skews_ms: np.ndarray
    fwd_ms: np.ndarray
    bwd_ms: np.ndarray
    reduce_width: np.ndarray
    reduce_ms: np.ndarray

    def __post_init__(self) -> None:
        self.widths = np.asarray(self.widths, dtype=np.float64)
        self.skews_ms = np.asarray(self.skews_ms, dtype=np.float64)
        self.fwd_ms = np.asarray(self.fwd_ms, dtype=np.float64)
        self.bwd_ms = np.asarray(self.bwd_ms, dtype=np.float64)
        self.reduce_width = np.asarray(self.reduce_width, dtype=np.float64)
        self.reduce_ms = np.asarray(self.reduce_ms, dtype=np.float64)
        if self.reduce_ms.ndim == 1:
            self.reduce_ms = np.repeat(self.reduce_ms[:, None], self.num_devices, axis=1)

    @property
    def num_devices(self) -> int:
        return int(self.widths.shape[1])

    @property
    def reduce_ms_per_sample(self) -> np.ndarray:
        """(P,) the reduction's time of each sample: the mean over devices (what every model fits)."""
        return reduce_time_ms(self.reduce_ms)

    def __len__(self) -> int:
        return int(self.widths.shape[0])

    def reducing(self) -> "CommSamples":
        """The samples that reduce row-wise partial sums (``reduce_width > 0``)."""
        return self.subset(np.flatnonzero(self.reduce_width > 0))

    def subset(self, rows: np.ndarray) -> "CommSamples":
        return CommSamples(self.widths[rows], self.skews_ms[rows], self.fwd_ms[rows], self.bwd_ms[rows],
                           self.reduce_width[rows], self.reduce_ms[rows])


def as_comm_groups(samples: "CommSamples | Sequence[CommSamples]") -> list[CommSamples]:
    groups = [samples] if isinstance(samples, CommSamples) else list(samples)
    groups = [g for g in groups if len(g)]
    if not groups:
        raise NeuroShardError("no communication samples to fit")
    return groups


# ------------------------------------------------------------------ interfaces
class CostModel(BaseEstimator):
    """What every cost model shares. ``state_dict`` is plain data a checkpoint holds
    (tensors, numbers, strings, lists, dicts): ``{"hparams": get_params(), **fitted state}``;
    ``from_state_dict`` builds the model from it through its constructor."""

    def fitted_state(self) -> dict:
        """The fitted state as plain data (empty when not fitted)."""
        return {}

    def load_fitted_state(self, state: dict) -> None:
        """Set the fitted state from ``fitted_state``'s dict."""

    @classmethod
    def upgrade_v1(cls, state: dict) -> dict:
        """A state written by checkpoint format v1, in this version's layout."""
        return state

    @property
    def hparams(self) -> dict:
        """The hyper-parameters (``get_params()``)."""
        return self.get_params(deep=False)

    def state_dict(self) -> dict:
        return {"hparams": self.hparams, **self.fitted_state()}

    def load_state_dict(self, state: dict) -> None:
        self.set_params(**state["hparams"])
        self.load_fitted_state(state)

    @classmethod
    def from_state_dict(cls, state: dict) -> "CostModel":
        """The model ``state_dict`` describes, built by its constructor."""
        model = cls(**state["hparams"])
        model.load_fitted_state(state)
        return model


class ComputeCostModel(CostModel, ABC):
    """Shard set -> fused forward+backward kernel time (ms)."""

    name = "compute"

    @abstractmethod
    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "ComputeCostModel":
        """Learn from measured shard sets."""

    @abstractmethod
    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """Predicted ms for each shard set (thousands per call)."""

    def evaluate(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, **kwargs) -> dict:
        """GMAE, MAPE, Kendall tau and plan-pair accuracy on measured sets (see ``metrics``)."""
        return cost_metrics(self.predict(sets), np.asarray(costs_ms), **kwargs)


class CommCostModel(CostModel, ABC):
    """Per-device all-to-all widths -> per-device communication times (ms), any device count."""

    name = "comm"

    @abstractmethod
    def fit(self, samples: "CommSamples | Sequence[CommSamples]") -> "CommCostModel":
        """Learn from measurements at one or more device counts."""

    @abstractmethod
    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        """(P, D) widths and start skews -> (P, D) forward all-to-all ms, waiting included."""

    @abstractmethod
    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        """(P, D) widths -> (P, D) backward all-to-all ms."""

    @abstractmethod
    def predict_reduce(self, reduce_width: np.ndarray, num_devices: int) -> np.ndarray:
        """(P,) columns of row-wise partial sums to reduce over ``num_devices`` -> (P,) ms per device
        (0 where there is nothing to reduce)."""

    def evaluate(self, samples: "CommSamples | Sequence[CommSamples]", **kwargs) -> dict:
        """Metrics per direction (``fwd``, ``bwd``, ``reduce``) over all devices of all samples."""
        return comm_metrics(self, as_comm_groups(samples), **kwargs)


class CommAtDevices:
    """A communication model bound to one device count (what ``CostModels.comm_for`` returns)."""

    def __init__(self, model: CommCostModel, num_devices: int):
        self.model = model
        self.num_devices = int(num_devices)

    def _check(self, widths: np.ndarray) -> np.ndarray:
        widths = np.asarray(widths, dtype=np.float64)
        if widths.ndim == 1:
            widths = widths[None, :]
        if widths.shape[1] != self.num_devices:
            raise NeuroShardError(f"widths have {widths.shape[1]} devices, this model is bound to {self.num_devices}")
        return widths

    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        widths = self._check(widths)
        return self.model.predict_forward(widths, np.asarray(skews_ms, dtype=np.float64).reshape(widths.shape))

    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        return self.model.predict_backward(self._check(widths))

    def predict_reduce(self, reduce_width: np.ndarray) -> np.ndarray:
        return self.model.predict_reduce(np.atleast_1d(np.asarray(reduce_width, dtype=np.float64)), self.num_devices)


@dataclass
class CostModels:
    """What search needs: a compute model and one communication model (any device count),
    measured at ``batch_size`` on ``hardware``."""

    compute: ComputeCostModel
    comm: CommCostModel
    batch_size: int
    hardware: dict = field(default_factory=dict)
    name: str = "cost-models"
    metrics: dict = field(default_factory=dict)
    data_summary: dict = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False)

    def comm_for(self, num_devices: int) -> CommAtDevices:
        """The communication model for plans over ``num_devices`` devices."""
        if num_devices < 1:
            raise NeuroShardError(f"num_devices must be >= 1, got {num_devices}")
        return CommAtDevices(self.comm, num_devices)

    def comm_device_counts(self) -> list[int]:
        """The device counts the communication data was measured at (empty when unrecorded)."""
        samples = ((self.data_summary or {}).get("comm") or {}).get("samples") or {}
        return sorted(int(k) for k in samples if str(k).isdigit())

    def describe_hardware(self) -> str:
        """Where the models' data was measured, in a few words: the machine (GPU or CPU model
        and cores), the backend and kernel, and where it was calibrated."""
        record = self.hardware or {}
        machine, config = record.get("hardware") or {}, record.get("config") or {}
        where = machine.get("gpu") or machine.get("cpu_model")
        if where and not machine.get("gpu") and machine.get("cpu_count"):
            where = f"{where}, {machine['cpu_count']} cores"
        text = where or str(record.get("note") or "unrecorded hardware")
        if config.get("backend"):
            text += f", {config['backend']} {config.get('kernel', '')}".rstrip()
        if record.get("calibrated_on"):
            text += f"; calibrated on {record['calibrated_on']}"
        return text

    def scale(self, batch_size: int) -> float:
        """Factor turning this bundle's ms into ms at ``batch_size`` (linear in the batch)."""
        return float(batch_size) / float(self.batch_size)

    def save(self, path: str | Path) -> Path:
        """Write one checkpoint file (atomically); see ``checkpoint``."""
        return checkpoint.save_cost_models(self, path)

    @classmethod
    def load(cls, path: str | Path, payload: dict | None = None) -> "CostModels":
        """Read a checkpoint written by ``save`` (``payload``: its dict, already read with
        ``checkpoint.read_checkpoint``); refuses another feature schema version, and models
        whose predictions are not finite and non-negative (``check_predictions``)."""
        payload = checkpoint.read_checkpoint(path) if payload is None else payload
        models = cls(**checkpoint.load_parts(path, payload)).check_predictions()
        # The checksum is the last word: what is wrong in the contents, when something is (a
        # field, models predicting NaN), is the more useful line; else the damage.
        checkpoint.check_checksum(payload, checkpoint.shipped_checkpoint(path))
        return models

    def check_predictions(self) -> "CostModels":
        """``self``, after predicting a few ordinary shard sets (1-6 tables) and exchanges
        (2 and 8 devices): NeuroShardError naming the checkpoint when any prediction is NaN,
        infinite or negative (a damaged or diverged model: a search against it would put
        every table on one device and write NaN into the plan)."""
        probe = [Table(f"probe{i}", rows, dim, pooling_factor=pool) for i, (rows, dim, pool) in
                 enumerate([(1000, 16, 1.0), (100_000, 64, 4.0), (5_000_000, 128, 20.0), (20_000, 32, 2.0),
                            (300_000, 8, 1.0), (50, 256, 60.0)])]
        found = {"compute": self.compute.predict([shard_set_features(probe[:k], self.batch_size) for k in (1, 3, 6)])}
        for devices in (2, 8):
            comm, widths = self.comm_for(devices), np.full((1, devices), 256.0)
            found[f"forward exchange ({devices} devices)"] = comm.predict_forward(widths, np.zeros((1, devices)))
            found[f"backward exchange ({devices} devices)"] = comm.predict_backward(widths)
            found[f"reduction ({devices} devices)"] = comm.predict_reduce(np.array([256.0]))
        for what, values in found.items():
            values = np.asarray(values, dtype=np.float64)
            if not np.isfinite(values).all() or (values < 0).any():
                bad = "NaN or infinite" if not np.isfinite(values).all() else "negative"
                raise NeuroShardError(f"{self.path or self.name}: cost model '{self.name}' predicts {bad} "
                                      f"{what} costs on ordinary inputs; refused (a damaged or diverged model)")
        return self
