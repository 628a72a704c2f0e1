"""Analytic cost models in the style of TorchRec's shard estimator.

Time = bytes moved / bandwidth + per-kernel and per-table overheads. Every term is a
non-negative constant times a physical quantity, so the constants can be fitted to
measurements with non-negative least squares (on relative error) and stay
meaningful; the defaults are rough single-thread CPU figures usable unfitted.

Compute (one fused kernel over a shard set, batch ``B``, 4-byte floats)::

    ms = kernel + per_table * shards + lookup * sum(B pf dim 4)        # gathers, fwd + bwd
       + output * sum(B dim 4)                                         # pooled out / grad in
       + update * sum(B pf dim 4 / mean_reuse)                         # distinct rows updated
       + miss * sum(B pf dim 4 / mean_reuse * [table > cache])         # cold rows from DRAM

Communication (D devices, widths w_d, W = sum w, per-device bytes)::

    send_d = B w_d 4 (D-1)/D      recv_d = B/D (W - w_d) 4      peak = max_e max(send_e, recv_e)
    fwd_d  = a0 + a1 (D-1) + a2 send_d + a3 recv_d + a4 peak + a5 (max(skew) - skew_d)
    bwd_d  = same terms, own constants, no waiting
    reduce = r0 + r1 (D-1) + r2 B R 4 (D-1)/D
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from ..constants import FP32_BYTES, MEASURED_BATCH_SIZE
from .base import CommCostModel, CommSamples, ComputeCostModel, as_comm_groups, pack_sets, register_model, set_sums
from .features import FEATURE_NAMES

log = logging.getLogger(__name__)

_DIM = FEATURE_NAMES.index("dim")
_POOL = FEATURE_NAMES.index("pooling_factor")
_LOG_SIZE = FEATURE_NAMES.index("log2_size_bytes")
_LOG_REUSE = FEATURE_NAMES.index("log2_mean_reuse")


def _constants(values, count: int, name: str) -> np.ndarray:
    """Stored constants as an array, checked for their count."""
    coef = np.asarray(values, dtype=np.float64)
    if coef.shape != (count,):
        raise ValueError(f"'{name}' must hold {count} numbers, got shape {coef.shape}")
    return coef


def _fit_relative_nnls(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Non-negative constants minimising the squared *relative* error of design @ c vs target."""
    from scipy.optimize import nnls  # heavy (scipy.optimize): imported when a model is fitted
    target = np.asarray(target, dtype=np.float64)
    keep = np.isfinite(target) & (target > 0) & np.isfinite(design).all(axis=1)
    design, target = design[keep], target[keep]
    scale = design.max(axis=0)
    scale[scale <= 0] = 1.0  # columns are rescaled so NNLS sees comparable magnitudes
    coef, _ = nnls(design / scale / target[:, None], np.ones(len(target)), maxiter=50 * design.shape[1])
    return coef / scale


@register_model
class AnalyticComputeModel(ComputeCostModel):
    """Bytes over bandwidth plus overheads (TorchRec-style), constants fitted by NNLS
    (``coef_``; unfitted, it predicts with ``DEFAULTS``)."""

    name = "analytic"
    TERMS = ("kernel_ms", "per_table_ms", "lookup_ms_per_byte", "output_ms_per_byte",
             "update_ms_per_byte", "miss_ms_per_byte")
    #: single-thread CPU guesses: ~0.05 ms launch, ~2 GB/s gathers fwd+bwd, ~8 GB/s streams
    DEFAULTS = (0.05, 0.01, 5e-7, 1.2e-7, 3e-7, 5e-7)

    def __init__(self, batch_size: int = MEASURED_BATCH_SIZE, cache_bytes: float = 2**23):
        self.batch_size = batch_size
        self.cache_bytes = cache_bytes

    @property
    def fitted(self) -> bool:
        return hasattr(self, "coef_")

    @property
    def coef(self) -> np.ndarray:
        """The fitted constants, or the defaults before ``fit``."""
        return self.coef_ if self.fitted else np.array(self.DEFAULTS, dtype=np.float64)

    def design(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """(num_sets, len(TERMS)) physical quantities each constant multiplies."""
        shards, index, num_sets = pack_sets(sets)
        b = float(self.batch_size)
        dim, pool = shards[:, _DIM].astype(np.float64), shards[:, _POOL].astype(np.float64)
        lookup_bytes = b * pool * dim * float(FP32_BYTES)
        distinct_bytes = lookup_bytes / np.exp2(shards[:, _LOG_REUSE].astype(np.float64))
        cold = (np.exp2(shards[:, _LOG_SIZE].astype(np.float64)) > float(self.cache_bytes)).astype(np.float64)
        per_shard = np.stack([np.ones_like(dim), lookup_bytes, b * dim * float(FP32_BYTES), distinct_bytes, distinct_bytes * cold], 1)
        sums = set_sums(per_shard, index, num_sets)
        nonempty = (sums[:, 0] > 0).astype(np.float64)
        return np.column_stack([nonempty, sums])

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "AnalyticComputeModel":
        self.coef_ = _fit_relative_nnls(self.design(sets), costs_ms)
        log.info("analytic compute constants: %s", dict(zip(self.TERMS, self.coef.round(12))))
        return self

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.design(sets) @ self.coef

    def fitted_state(self) -> dict:
        return {"coef": self.coef_.tolist()} if self.fitted else {}

    def load_fitted_state(self, state: dict) -> None:
        if "coef" in state:
            self.coef_ = _constants(state["coef"], len(self.TERMS), "coef")

    @classmethod
    def upgrade_v1(cls, state: dict) -> dict:
        return {"hparams": {"batch_size": state["batch_size"], "cache_bytes": state["cache_bytes"]},
                **({"coef": state["coef"]} if state["fitted"] else {})}


#: the last axis of ``comm_terms``, by name
COMM_TERMS = ("one", "peers", "send_bytes", "recv_bytes", "peak_bytes")
ONE, PEERS, SEND_BYTES, RECV_BYTES, PEAK_BYTES = range(len(COMM_TERMS))
#: the columns of ``reduce_terms``, by name (``ONE`` and ``PEERS`` as above)
REDUCE_TERMS = ("one", "peers", "reduce_bytes")
REDUCE_BYTES = REDUCE_TERMS.index("reduce_bytes")


def comm_terms(widths: np.ndarray, batch_size: int) -> np.ndarray:
    """(P, D, 5) per-device quantities (``COMM_TERMS``): 1, D-1, send bytes, receive bytes,
    peak bytes of the exchange."""
    widths = np.asarray(widths, dtype=np.float64)
    d = widths.shape[1]
    b = float(batch_size)
    send = b * widths * float(FP32_BYTES) * (d - 1) / d
    recv = b / d * (widths.sum(axis=1, keepdims=True) - widths) * float(FP32_BYTES)
    peak = np.maximum(send, recv).max(axis=1, keepdims=True) * np.ones_like(widths)
    return np.stack([np.ones_like(widths), np.full_like(widths, d - 1), send, recv, peak], axis=-1)


def wait_ms(skews_ms: np.ndarray) -> np.ndarray:
    """(P, D) time each device waits for the last one to start: max(skew) - skew_d."""
    skews_ms = np.asarray(skews_ms, dtype=np.float64)
    return skews_ms.max(axis=1, keepdims=True) - skews_ms


def reduce_terms(reduce_width: np.ndarray, num_devices: int, batch_size: int) -> np.ndarray:
    """(P, 3) quantities of the row-wise reduction (``REDUCE_TERMS``): 1, D-1, bytes per device."""
    r = np.asarray(reduce_width, dtype=np.float64)
    d = float(num_devices)
    return np.stack([np.ones_like(r), np.full_like(r, d - 1), batch_size * r * float(FP32_BYTES) * (d - 1) / d], axis=1)


@register_model
class AnalyticCommModel(CommCostModel):
    """All-to-all as latency + bytes over bandwidth (+ waiting for late starters), NNLS-fitted."""

    name = "analytic"
    #: loopback gloo guesses: 0.1 ms call, 0.03 ms per peer, ~1 GB/s, wait counted in full
    FWD_DEFAULTS = (0.1, 0.03, 5e-7, 5e-7, 2e-7, 1.0)
    BWD_DEFAULTS = (0.1, 0.03, 5e-7, 5e-7, 2e-7)
    REDUCE_DEFAULTS = (0.05, 0.03, 1e-6)

    def __init__(self, batch_size: int = MEASURED_BATCH_SIZE):
        self.batch_size = batch_size

    @property
    def fitted(self) -> bool:
        return hasattr(self, "fwd_coef_")

    @property
    def coefs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(forward, backward, reduce) constants: fitted, or the defaults before ``fit``."""
        if self.fitted:
            return self.fwd_coef_, self.bwd_coef_, self.reduce_coef_
        return np.array(self.FWD_DEFAULTS), np.array(self.BWD_DEFAULTS), np.array(self.REDUCE_DEFAULTS)

    def fit(self, samples: CommSamples | Sequence[CommSamples]) -> "AnalyticCommModel":
        groups = as_comm_groups(samples)
        fwd_x = np.concatenate([np.concatenate([comm_terms(g.widths, self.batch_size),
                                                wait_ms(g.skews_ms)[..., None]], -1).reshape(-1, 6) for g in groups])
        bwd_x = np.concatenate([comm_terms(g.widths, self.batch_size).reshape(-1, 5) for g in groups])
        reducing = [g.reducing() for g in groups if (g.reduce_width > 0).any()]
        self.fwd_coef_ = _fit_relative_nnls(fwd_x, np.concatenate([g.fwd_ms.ravel() for g in groups]))
        self.bwd_coef_ = _fit_relative_nnls(bwd_x, np.concatenate([g.bwd_ms.ravel() for g in groups]))
        self.reduce_coef_ = np.array(self.REDUCE_DEFAULTS)  # kept where no reduction was measured
        if reducing:
            red_x = np.concatenate([reduce_terms(g.reduce_width, g.num_devices, self.batch_size) for g in reducing])
            self.reduce_coef_ = _fit_relative_nnls(red_x, np.concatenate([g.reduce_ms_per_sample for g in reducing]))
        log.info("analytic comm constants: fwd %s bwd %s reduce %s", *self.coefs)
        return self

    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        fwd = self.coefs[0]
        return comm_terms(widths, self.batch_size) @ fwd[:5] + fwd[5] * wait_ms(skews_ms)

    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        return comm_terms(widths, self.batch_size) @ self.coefs[1]

    def predict_reduce(self, reduce_width: np.ndarray, num_devices: int) -> np.ndarray:
        reduce_width = np.asarray(reduce_width, dtype=np.float64)
        return (reduce_terms(reduce_width, num_devices, self.batch_size) @ self.coefs[2]) * (reduce_width > 0)

    _COEFS = (("fwd_coef", FWD_DEFAULTS), ("bwd_coef", BWD_DEFAULTS), ("reduce_coef", REDUCE_DEFAULTS))

    def fitted_state(self) -> dict:
        return {name: getattr(self, name + "_").tolist() for name, _ in self._COEFS} if self.fitted else {}

    def load_fitted_state(self, state: dict) -> None:
        if "fwd_coef" in state:
            for name, defaults in self._COEFS:
                setattr(self, name + "_", _constants(state[name], len(defaults), name))

    @classmethod
    def upgrade_v1(cls, state: dict) -> dict:
        fitted = {name: state[name] for name, _ in cls._COEFS} if state["fitted"] else {}
        return {"hparams": {"batch_size": state["batch_size"]}, **fitted}
