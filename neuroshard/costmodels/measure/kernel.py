"""Kernel benchmark: forward + backward of a set of shards on one device, as one fused op.

Training runs all shards of a device as one fused operation, so that is what is
timed:

* ``fbgemm_tbe`` (preferred): fbgemm's table-batched embedding,
  ``SplitTableBatchedEmbeddingBagsCodegen``, one table per shard, sum pooling, its
  optimizer (exact SGD or exact row-wise adagrad) fused into the backward. On CPU
  (``fbgemm-gpu-cpu``) weights live on the host (``EmbeddingLocation.HOST``,
  ``ComputeDevice.CPU``); on CUDA in device memory.
* ``embedding_bag`` (fallback when fbgemm is not importable): PyTorch has no
  table-batched op, so shards are fused **per width group**: the shards of equal
  width are stacked into one ``nn.EmbeddingBag`` (rows concatenated, each
  shard's ids shifted by its row offset, one bag per (shard, sample)); the groups
  (at most one per distinct width) run one after another. Backward is a real
  sparse gradient of ``sum(outputs)`` followed by an in-place SGD update.

Every measurement: a real gradient (``sum`` of the pooled outputs, backward),
``warmup`` untimed runs, then ``repeats`` timed runs (more, up to ``max_repeats``,
while the coefficient of variation stays above ``target_cv``), each preceded by a
cache flush (reading a buffer larger than the last-level cache). The reported
cost is the median. On CPU a device is one thread: the benchmark sets
``torch.set_num_threads(1)`` while it runs and restores it afterwards, and by
default times with the thread's CPU clock (``clock="thread"``): on a machine
shared with other work, the time the thread spends descheduled is not the
device's cost. ``clock="wall"`` uses ``time.perf_counter``; on CUDA, CUDA events.

Lookups are ``Table.sample_lookups(batch_size)`` of each shard. Rows beyond
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

from ...errors import NeuroShardError
from ...tables import Table

log = logging.getLogger(__name__)

KERNELS = ("fbgemm_tbe", "embedding_bag")
BACKENDS = ("cpu", "cuda")
CLOCKS = ("thread", "wall")
OPTIMIZERS = ("exact_sgd", "exact_rowwise_adagrad")
DEFAULT_CPU_BATCH_SIZE = 4096   # a per-device share of a 64k-256k global batch that one CPU thread runs in ms
DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_MEMORY_BYTES = 1 << 30


def fbgemm_available(backend: str = "cpu") -> bool:
    """Whether fbgemm's table-batched embedding can run on ``backend``."""
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
            SplitTableBatchedEmbeddingBagsCodegen)
    except Exception:  # ImportError, or a library load error of a mismatched build
        return False
    if backend == "cuda":
        import torch
        return torch.cuda.is_available()
    return True


def resolve_kernel(kernel: str, backend: str) -> str:
    """``auto`` -> the best kernel available; an unknown name -> NeuroShardError."""
    if backend not in BACKENDS:
        raise NeuroShardError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if kernel == "auto":
        return "fbgemm_tbe" if fbgemm_available(backend) else "embedding_bag"
    if kernel not in KERNELS:
        raise NeuroShardError(f"unknown kernel {kernel!r}; choose one of auto, {', '.join(KERNELS)}")
    if kernel == "fbgemm_tbe" and not fbgemm_available(backend):
        raise NeuroShardError(f"kernel fbgemm_tbe is not available for backend {backend} "
                              f"(install fbgemm-gpu{'-cpu' if backend == 'cpu' else ''})")
    return kernel


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

    def __init__(self, backend: str = "cpu", kernel: str = "auto", batch_size: int = DEFAULT_CPU_BATCH_SIZE,
                 max_rows: int = DEFAULT_MAX_ROWS, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 warmup: int = 2, repeats: int = 5, max_repeats: int = 11, target_cv: float = 0.05,
                 optimizer: str = "exact_sgd", clock: str = "auto", flush_bytes: int | None = None,
                 threads: int = 1, seed: int = 0) -> None:
        self.backend = backend
        self.kernel = resolve_kernel(kernel, backend)
        if backend == "cuda":
            import torch
            if not torch.cuda.is_available():
                raise NeuroShardError("backend cuda asked for, but torch sees no CUDA device")
        if optimizer not in OPTIMIZERS:
            raise NeuroShardError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
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
            min(int(llc_bytes() * 1.25), 512 << 20) if backend == "cpu" else 256 << 20)
        self._flush_buffer = None

    def config(self) -> dict:
        """What a dataset must record to be reproducible on the same hardware."""
        return {"backend": self.backend, "kernel": self.kernel, "batch_size": self.batch_size,
                "max_rows": self.max_rows, "optimizer": self.optimizer, "clock": self.clock,
                "threads": self.threads, "warmup": self.warmup, "repeats": self.repeats,
                "max_repeats": self.max_repeats, "target_cv": self.target_cv, "flush_bytes": self.flush_bytes}

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
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with torch.no_grad():
                inputs = self._inputs(shards)
            run = self._build(shards, inputs)
            return self._time(run)
        finally:
            torch.set_num_threads(previous_threads)

    # ------------------------------------------------------------- internals
    @property
    def _device(self):
        import torch
        return torch.device("cuda" if self.backend == "cuda" else "cpu")

    def _inputs(self, shards: Sequence[Table]) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """(folded row ids, lengths, allocated rows) of each shard."""
        out = []
        for t in shards:
            rows, lengths = t.sample_lookups(self.batch_size)
            alloc = min(t.num_embeddings, self.max_rows)
            rows = np.asarray(rows, dtype=np.int64)
            if alloc < t.num_embeddings:
                rows = rows % alloc
            out.append((rows, np.asarray(lengths, dtype=np.int64), alloc))
        return out

    def _build(self, shards, inputs):
        if self.kernel == "fbgemm_tbe":
            return self._build_tbe(shards, inputs)
        return self._build_embedding_bag(shards, inputs)

    def _build_tbe(self, shards, inputs):
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
        cuda = self.backend == "cuda"
        location = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
        compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
        specs = [(alloc, t.embedding_dim, location, compute) for t, (_, _, alloc) in zip(shards, inputs)]
        optimizer = {"exact_sgd": EmbOptimType.EXACT_SGD,
                     "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[self.optimizer]
        try:
            tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=optimizer, learning_rate=0.01,
                                                        device=self._device)
        except (RuntimeError, MemoryError) as exc:
            raise NeuroShardError(f"cannot allocate the fused kernel for {len(shards)} shards: "
                                  f"{str(exc).splitlines()[0]}") from None
        with torch.no_grad():  # values do not change the speed; writing maps every page before timing
            tbe.weights_host.fill_(0.01) if not cuda else tbe.weights_dev.fill_(0.01)
        indices = torch.from_numpy(np.concatenate([r for r, _, _ in inputs])).to(self._device)
        lengths = np.concatenate([length for _, length, _ in inputs])
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)).to(self._device)

        def forward():
            return tbe(indices, offsets)

        return forward

    def _build_embedding_bag(self, shards, inputs):
        import torch
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(shards):
            groups.setdefault(t.embedding_dim, []).append(i)
        bags = []
        for width, members in groups.items():
            total_rows = sum(inputs[i][2] for i in members)
            bag = torch.nn.EmbeddingBag(total_rows, width, mode="sum", sparse=True).to(self._device)
            with torch.no_grad():
                bag.weight.fill_(0.01)
            ids, lens, base = [], [], 0
            for i in members:
                rows, lengths, alloc = inputs[i]
                ids.append(rows + base)
                lens.append(lengths)
                base += alloc
            lengths = np.concatenate(lens)
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            bags.append((bag, torch.from_numpy(np.concatenate(ids)).to(self._device),
                         torch.from_numpy(offsets).to(self._device), len(members)))
        optimizer = torch.optim.SGD([b.weight for b, _, _, _ in bags], lr=0.01)
        batch = self.batch_size

        class _Fused:  # forward returns a tensor whose backward also applies the update
            def __call__(self):
                optimizer.zero_grad(set_to_none=True)
                outs = [bag(ids, offsets).view(n, batch, -1).transpose(0, 1).reshape(batch, -1)
                        for bag, ids, offsets, n in bags]
                return _StepOnBackward(torch.cat(outs, dim=1) if len(outs) > 1 else outs[0], optimizer)

        return _Fused()

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

    def _time(self, forward) -> ComputeMeasurement:
        import torch
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
                out = forward()
                mid.record()
                out.sum().backward()
                end.record()
                torch.cuda.synchronize()
                fwd, total = start.elapsed_time(mid), start.elapsed_time(end)
            else:
                t0 = clock()
                out = forward()
                t1 = clock()
                out.sum().backward()
                t2 = clock()
                fwd, total = (t1 - t0) / 1e6, (t2 - t0) / 1e6
            del out
            runs += 1
            if runs <= self.warmup:
                continue
            totals.append(total)
            forwards.append(fwd)
            if len(totals) >= self.repeats and (coefficient_of_variation(totals) <= self.target_cv
                                                or len(totals) >= self.max_repeats):
                break
        return ComputeMeasurement(cost_ms=float(statistics.median(totals)), fwd_ms=float(statistics.median(forwards)),
                                  times_ms=[round(x, 4) for x in totals], cv=coefficient_of_variation(totals),
                                  kernel=self.kernel, batch_size=self.batch_size)


class _StepOnBackward:
    """Pooled output of the EmbeddingBag fallback: ``.sum().backward()`` back-propagates
    and applies the SGD step, as TBE's fused backward does."""

    def __init__(self, output, optimizer) -> None:
        self.output = output
        self.optimizer = optimizer

    @property
    def shape(self):
        return self.output.shape

    def sum(self):
        return _Backward(self.output.sum(), self.optimizer)


class _Backward:
    def __init__(self, loss, optimizer) -> None:
        self.loss = loss
        self.optimizer = optimizer

    def backward(self) -> None:
        self.loss.backward()
        self.optimizer.step()


def measure_compute(shards: Sequence[Table], **kwargs) -> ComputeMeasurement:
    """One-off: time ``shards`` with a fresh ``KernelBenchmark(**kwargs)``."""
    return KernelBenchmark(**kwargs).measure(shards)
