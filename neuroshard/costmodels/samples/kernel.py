"""Kernel benchmark: forward + backward of a set of shards on one device, as one fused op.

Training runs all shards of a device as one fused operation, so that is what is
timed: ``neuroshard.execution.kernels.FusedEmbedding``, the same fused kernel the training
runtime runs (``fbgemm_tbe``, fbgemm's table-batched embedding with its optimizer
fused into the backward, preferred; ``embedding_bag``, shards stacked per width
group, as the fallback when fbgemm is not importable).

Every measurement: a real gradient (``sum`` of the pooled outputs, backward),
``warmup`` untimed runs, then ``repeats`` timed runs (more, up to ``max_repeats``,
while the coefficient of variation stays above ``target_cv``), each preceded by a
cache flush (reading a buffer larger than the last-level cache). The reported
cost is the median. On CPU a device is one thread: the benchmark sets
``torch.set_num_threads(1)`` while it runs and restores it afterwards, and by
default times with the thread's CPU clock (``clock="thread"``): on a machine
shared with other work, the time the thread spends descheduled is not the
device's cost. ``clock="wall"`` uses ``time.perf_counter``; on CUDA, CUDA events.

Lookups are ``datasets.sampler.sample_lookups(shard, batch_size)`` of each shard. Rows beyond
``max_rows`` are not allocated: ids are folded (``row % max_rows``), so a
50-million-row table is timed on a ``max_rows``-row buffer with the same lookups
per sample and reuse pattern (only its cache-miss rate on cold rows is an
approximation; ``max_rows`` is recorded with every dataset).
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...constants import (
    CLOCKS,
    DEFAULT_MAX_ROWS,
    FLUSH_BYTES_ENV,
    KERNEL_MAX_REPEATS,
    KERNEL_REPEATS,
    MEASURED_BATCH_SIZE,
)
from ...datasets.sampler import sample_lookups
from ...errors import NeuroShardError
from ...execution.kernels import (  # noqa: F401
    BACKENDS,
    TIMED_OPTIMIZERS,
    FusedEmbedding,
    FusedInputs,
    fbgemm_available,
    resolve_kernel,
)
from ...tables import Table
from ...units import parse_bytes
from ...validate import check_weights_precision
from ..base import few_threads

log = logging.getLogger(__name__)


DEFAULT_MEMORY_BYTES = 1 << 30


def llc_bytes() -> int:
    """Size of the last-level cache (from sysfs; 64 MiB when unknown)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as handle:
                    text = handle.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            digits = text[:-1] if text[-1:] in "KMG" else text
            if digits.isdigit():
                best = max(best, int(digits) * mult)
    except OSError:
        pass
    return best or 64 << 20


def cache_flush_bytes() -> int:
    """The flush that evicts this CPU's last-level cache: 1.25x its size, at most 512 MiB (also
    what tells stored data of another cache apart, ``store.same_cpu``)."""
    return min(int(llc_bytes() * 1.25), 512 << 20)


def default_flush_bytes() -> int:
    """The CPU cache flush a kernel benchmark reads before every timed run: the environment's
    ``FLUSH_BYTES_ENV`` when set (a size as ``measure --flush-bytes`` reads it: bytes, ``8MiB``;
    ``0`` or ``none``: no flush), else ``cache_flush_bytes()``."""
    text = os.environ.get(FLUSH_BYTES_ENV, "").strip()
    if not text:
        return cache_flush_bytes()
    if text in ("0", "none"):
        return 0
    try:
        return parse_bytes(text)
    except NeuroShardError as exc:
        raise NeuroShardError(f"{FLUSH_BYTES_ENV}: {exc}") from None


@dataclass
class ComputeMeasurement:
    """Result of timing one shard set."""

    cost_ms: float                 # median forward + backward
    fwd_ms: float                  # median forward
    times_ms: list[float]          # every timed forward + backward
    cv: float                      # coefficient of variation of times_ms
    kernel: str
    batch_size: int
    extra: dict = field(default_factory=dict)


def coefficient_of_variation(values: Sequence[float]) -> float:
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or values.mean() <= 0:
        return 0.0
    return float(values.std(ddof=1) / values.mean())


class KernelBenchmark:
    """Times forward + backward of shard sets on one device with one fused kernel.

    Hyper-parameters are set once; ``measure(shards)`` times one set. Reuse one
    benchmark for many sets (the cache-flush buffer is allocated once)."""

    def __init__(self, backend: str = "cpu", kernel: str = "auto", batch_size: int = MEASURED_BATCH_SIZE,
                 max_rows: int = DEFAULT_MAX_ROWS, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 warmup: int = 2, repeats: int = KERNEL_REPEATS, max_repeats: int = KERNEL_MAX_REPEATS,
                 target_cv: float = 0.05,
                 optimizer: str = "exact_sgd", clock: str = "auto", flush_bytes: int | None = None,
                 threads: int = 1, seed: int = 0, weights_precision: str = "fp32") -> None:
        self.backend = backend
        self.kernel = resolve_kernel(kernel, backend)
        if backend == "cuda":
            import torch
            if not torch.cuda.is_available():
                raise NeuroShardError("backend cuda asked for, but torch sees no CUDA device")
        if optimizer not in TIMED_OPTIMIZERS:
            raise NeuroShardError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(TIMED_OPTIMIZERS)}")
        self.weights_precision = check_weights_precision(weights_precision)
        if clock == "auto":
            clock = "wall" if backend == "cuda" else "thread"
        if clock not in CLOCKS or (backend == "cuda" and clock == "thread"):
            raise NeuroShardError(f"unknown clock {clock!r} for backend {backend}; choose auto, "
                                  + ("wall" if backend == "cuda" else ", ".join(CLOCKS)))
        for name, value, low in (("batch_size", batch_size, 1), ("max_rows", max_rows, 1), ("repeats", repeats, 1),
                                 ("warmup", warmup, 0), ("threads", threads, 1), ("memory_bytes", memory_bytes, 1)):
            if not isinstance(value, int) or value < low:
                raise NeuroShardError(f"{name} must be an integer >= {low}, got {value!r}")
        self.batch_size = batch_size
        self.max_rows = max_rows
        self.memory_bytes = memory_bytes
        self.warmup = warmup
        self.repeats = repeats
        self.max_repeats = max(max_repeats, repeats)
        self.target_cv = target_cv
        self.optimizer = optimizer
        self.clock = clock
        self.threads = threads
        self.seed = seed
        self.flush_bytes = flush_bytes if flush_bytes is not None else (
            default_flush_bytes() if backend == "cpu" else 256 << 20)
        self._flush_buffer = None

    def config(self) -> dict:
        """What a dataset must record to be reproducible on the same hardware (the weights
        precision only when not fp32, so fp32 datasets are described as before)."""
        precision = {} if self.weights_precision == "fp32" else {"weights_precision": self.weights_precision}
        return {"backend": self.backend, "kernel": self.kernel, "batch_size": self.batch_size,
                "max_rows": self.max_rows, "optimizer": self.optimizer, "clock": self.clock,
                "threads": self.threads, "warmup": self.warmup, "repeats": self.repeats,
                "max_repeats": self.max_repeats, "target_cv": self.target_cv, "flush_bytes": self.flush_bytes,
                **precision}

    # ------------------------------------------------------------------ API
    def measure(self, shards: Sequence[Table]) -> ComputeMeasurement:
        """Median forward+backward time of ``shards`` run as one fused kernel."""
        import torch
        shards = list(shards)
        if not shards:
            raise NeuroShardError("a shard set to measure must hold at least one shard")
        logical = sum(t.size_bytes(4) for t in shards)
        if logical > self.memory_bytes:
            raise NeuroShardError(f"shard set of {logical / 2**20:.1f} MiB is over the device memory cap of "
                                  f"{self.memory_bytes / 2**20:.1f} MiB")
        with few_threads(self.threads):
            with torch.no_grad():
                lookups, rows = self._inputs(shards)
            fused = FusedEmbedding([(r, t.embedding_dim) for t, r in zip(shards, rows)], self.kernel,
                                   self._device, lr=0.01, init=0.01, optimizer=self.optimizer,
                                   weights_precision=self.weights_precision)
            return self._time(fused, fused.prepare(lookups))

    def time_fused(self, fused: FusedEmbedding, inputs: FusedInputs, repeats: int | None = None) -> ComputeMeasurement:
        """Time a kernel already built, on inputs already laid out, with this benchmark's
        protocol (cache flush before each run, warm-up, repeats, median, its clock and
        threads): what ``neuroshard measure`` runs for each device of a plan. ``repeats``:
        at least this many runs this time (default: the benchmark's)."""
        with few_threads(self.threads):
            return self._time(fused, inputs, repeats)

    # ------------------------------------------------------------- internals
    @property
    def _device(self):
        import torch
        return torch.device("cuda" if self.backend == "cuda" else "cpu")

    def _inputs(self, shards: Sequence[Table]):
        """Each shard's (folded row ids, bag offsets) as tensors, and its allocated rows."""
        import torch
        lookups, allocated = [], []
        for t in shards:
            rows, lengths = sample_lookups(t, self.batch_size)
            alloc = min(t.num_embeddings, self.max_rows)
            rows = np.asarray(rows, dtype=np.int64)
            if alloc < t.num_embeddings:
                rows = rows % alloc
            offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))[:-1]]).astype(np.int64)
            lookups.append((torch.from_numpy(rows), torch.from_numpy(offsets)))
            allocated.append(alloc)
        return lookups, allocated

    def _flush(self) -> None:
        import torch
        if self.flush_bytes <= 0:
            return
        if self._flush_buffer is None:
            self._flush_buffer = torch.ones(self.flush_bytes // 4, dtype=torch.float32, device=self._device)
        if self.backend == "cuda":
            self._flush_buffer.add_(1.0)
        else:
            float(self._flush_buffer.sum())

    def _time(self, fused: FusedEmbedding, inputs: FusedInputs, repeats: int | None = None) -> ComputeMeasurement:
        import torch
        repeats = repeats or self.repeats
        max_repeats = max(self.max_repeats, repeats)
        cuda = self.backend == "cuda"
        if cuda:
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        clock = time.thread_time_ns if self.clock == "thread" else time.perf_counter_ns
        totals, forwards = [], []
        runs = 0
        while True:
            self._flush()
            if cuda:
                torch.cuda.synchronize()
                start.record()
                out = fused.pooled(inputs)
                mid.record()
                out.sum().backward()
                fused.step()
                end.record()
                torch.cuda.synchronize()
                fwd, total = start.elapsed_time(mid), start.elapsed_time(end)
            else:
                t0 = clock()
                out = fused.pooled(inputs)
                t1 = clock()
                out.sum().backward()
                fused.step()
                t2 = clock()
                fwd, total = (t1 - t0) / 1e6, (t2 - t0) / 1e6
            del out
            runs += 1
            if runs <= self.warmup:
                continue
            totals.append(total)
            forwards.append(fwd)
            if len(totals) >= repeats and (coefficient_of_variation(totals) <= self.target_cv
                                           or len(totals) >= max_repeats):
                break
        return ComputeMeasurement(cost_ms=float(statistics.median(totals)), fwd_ms=float(statistics.median(forwards)),
                                  times_ms=[round(x, 4) for x in totals], cv=coefficient_of_variation(totals),
                                  kernel=self.kernel, batch_size=self.batch_size)
