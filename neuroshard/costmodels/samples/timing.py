"""The device timer: time sets of shards, each run as one fused kernel, round-robin.

A device's embedding compute does not depend on the other devices, so every device
of a plan of any device count can be timed one after another on one thread (CPU) or
one GPU. Each device's shards run as one ``neuroshard.execution.kernels.FusedEmbedding`` (what
training runs and cost data is collected with): forward, backward and the fused update,
timed with the kernel benchmark's protocol (``KernelBenchmark.time_fused``: cache flush
before every run, warm-up, median of repeats, the thread's CPU clock on CPU). A device
whose sizing runs (``TIMING_REPEATS``, before its first pass, never counted) are short
runs more times in every pass, until a pass adds up to ``TIMING_MIN_PASS_MS`` (at most
``TIMING_MAX_REPEATS`` runs): a few milliseconds of work is otherwise at the mercy of one
interruption. Every pass, the first included, runs that many: a device's first runs
after its kernel is built are slow (criteo-kaggle's 3-5 ms devices: the first timed
single run 1.3-1.6x the later ones, the first pass of 9 runs 1.04x), and calibration,
which times each set in one pass, measured them 1.2-1.5x what ``measure`` (the fastest
of 5 passes) gives the same sets until the first pass was sized too (docs/decisions.md#timing-passes).

Comparing on a shared, noisy machine: the devices take turns round-robin, the order
rotated every pass (after one untimed warm-up run of each kernel, and optional warm-up
passes). A neighbour on a shared machine only ever adds time, so a device's fastest pass
is its own cost with the least of that noise (a study in the git history: the max
device of a copy of a plan differed from another copy's by 0.4-0.8% on average with the
fastest of 5 passes, 1-3.6% with their median). But the machine's speed also moves in
phases longer than a pass (a neighbour's job on the other core, frequency), which the
fastest pass escapes only if every device had one quiet turn: the A/A of the max device of
two copies of a plan in one run reached 1.10-1.16 at 16 devices. So, by
default (``TIMING_REFERENCE``, two or more devices), a reference device (a kernel of its
own on the shards of the device of median work) runs a short turn
(``TIMING_REFERENCE_SHARE`` of the runs of its own passes) right before every device's turn, each pass is
returned relative to it (``pass × reference's fastest turn / reference's turn beside it``,
in ms at the run's quietest speed), and a device's figure is the median of those
(``device_time(passes, "median")``; ``config["figure"]`` says which figure a run's passes
call for): ``experiments/reference_timing.py``, criteo-kaggle at 8 devices, 4 runs, mean
|log A/A| of the max device 9.9% with the fastest raw pass, 2.5% relative to the
reference (AMD EPYC); 5.0% and 1.5% on an Intel Xeon (3 runs; docs/decisions.md#reference-device).
``time_devices`` is the ``types.DeviceTimer`` the measured loop uses.

Memory: on CPU the devices share one weights buffer the size of the largest device
(``FusedEmbedding(weights_buffer=)``), so a 128-device plan needs the memory of one
device. Rows beyond ``row_cap`` are not allocated (lookups fold onto the allocated
rows, as in training and collection); the cap is reported. By default
(``TIMING_HUGE_PAGES``) the buffer is advised into transparent huge pages before it is
written, or with ``huge_pages=False`` out of them (``execution.kernels.advise_huge_pages``;
``config["huge_pages"]`` says whether it got huge pages, read back from
``/proc/self/smaps``): with 4 KiB pages a device of big tables pays a TLB miss on most
lookups, and on a virtual machine the page walk is long and varies with where the pages
landed.
"""
from __future__ import annotations

import ctypes
import gc
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...constants import (
    DEFAULT_MAX_ROWS,
    MEASURED_BATCH_SIZE,
    TIMING_HUGE_PAGES,
    TIMING_MAX_REPEATS,
    TIMING_MIN_PASS_MS,
    TIMING_PASSES,
    TIMING_REFERENCE,
    TIMING_REFERENCE_SHARE,
    TIMING_REPEATS,
    TIMING_WARMUP_PASSES,
    WEIGHTS_PRECISIONS,
)
from ...datasets.sampler import sample_lookups
from ...errors import NeuroShardError
from ...execution.kernels import (
    FusedEmbedding,
    FusedInputs,
    advise_huge_pages,
    huge_page_bytes,
    local_lookups,
    resolve_kernel,
    weights_dtype,
    weights_numel,
)
from ...plan import Shard
from ...tables import TableSet
from .kernel import KernelBenchmark
from .store import cpu_model

log = logging.getLogger(__name__)

#: most memory the shared weights buffer may take (default: this share of the machine's memory)
MEMORY_SHARE = 0.5


def _return_freed_memory() -> None:
    """Free what the previous runs left in reference cycles and hand the heap memory this
    process freed back to the system (glibc ``malloc_trim``; a no-op elsewhere): a long run that times many device sets otherwise keeps the freed
    weights of earlier runs in its heap, and ``MemAvailable`` shrinks run after run until
    a set that fitted at the start is refused."""
    gc.collect()  # kernels of the previous run still held in reference cycles
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def available_memory_bytes() -> int:
    """Memory available to this process now (``MemAvailable`` once freed heap memory is
    returned; 8 GiB when unknown)."""
    _return_freed_memory()
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


@dataclass
class DeviceTimes:
    """One device's shards, its kernel's inputs, and its time in each pass."""

    shards: list[Shard]
    shapes: list[tuple[int, int]]  # (allocated rows, width) per shard
    inputs: list[tuple[Any, Any]]  # per shard (indices, offsets)
    passes_ms: list[float] = field(default_factory=list)
    reference_ms: list[float] = field(default_factory=list)  # the reference's turn right before each counted pass
    repeats: int | None = None  # runs per pass after the first (None: the timer's)
    fused: FusedEmbedding | None = None
    prepared: FusedInputs | None = None


#: how a device's figure is made from its passes (``device_time``), as ``time_devices``' config says
FIGURES = ("fastest", "median")


def device_time(passes_ms: Sequence[float], figure: str = "fastest") -> float:
    """A device's figure from its timed passes (ms; 0 for a device without shards):
    ``"fastest"``, the least (raw passes: a neighbour only ever adds time), or ``"median"``
    (passes relative to a reference timed beside them, whose phases the reference has
    cancelled; see the module docstring). ``time_devices`` says which in ``config["figure"]``."""
    if figure not in FIGURES:
        raise NeuroShardError(f"figure must be one of {', '.join(FIGURES)}, got {figure!r}")
    if not len(passes_ms):
        return 0.0
    return float(min(passes_ms)) if figure == "fastest" else float(np.median(passes_ms))


def device_figures(passes_ms: Sequence[Sequence[float]], config: dict) -> list[float]:
    """Each device's figure (``device_time``) from a run's passes, as the run's config says
    (``config["figure"]``; ``"fastest"`` for a run that does not say, e.g. a timer of tests)."""
    return [device_time(p, config.get("figure", "fastest")) for p in passes_ms]


def _work(dt: DeviceTimes) -> int:
    """A device's lookups times widths: what chooses the reference (the median)."""
    return sum(len(indices) * cols for (indices, _), (_, cols) in zip(dt.inputs, dt.shapes))


def _device_times(shards: Sequence[Shard], tables: TableSet, batch_size: int, row_cap: int) -> DeviceTimes:
    """One device's shards with their allocated shapes and lookups."""
    shapes, inputs = [], []
    for s in shards:
        table = tables[s.table]
        rows, lengths = sample_lookups(table, batch_size)
        allocated = min(s.num_rows, row_cap)
        shapes.append((allocated, s.num_cols))
        inputs.append(local_lookups(np.asarray(rows, dtype=np.int64), np.asarray(lengths, dtype=np.int64),
                                    s.row_offset, s.num_rows, table.num_embeddings, allocated))
    return DeviceTimes(list(shards), shapes, inputs)




def _pass_repeats(first_ms: float, repeats: int, min_pass_ms: float, max_repeats: int) -> int:
    """Runs per pass for a device whose sizing run (the median of ``repeats`` runs, not
    counted) took ``first_ms``: enough to add up to about ``min_pass_ms``, at least
    ``repeats`` and at most ``max_repeats``."""
    return min(max(repeats, math.ceil(min_pass_ms / max(first_ms, 1e-3))), max(repeats, max_repeats))


def _run_once(fused: FusedEmbedding, inputs: FusedInputs) -> None:
    """One untimed forward, backward and update."""
    fused.pooled(inputs).sum().backward()
    fused.step()


def _build(dt: DeviceTimes, kernel: str, device: Any, optimizer: str, buffer: Any,
           weights_precision: str = "fp32") -> None:
    """Build a device's fused kernel on its lookups and run it once, untimed (first-call
    allocations are not timed)."""
    dt.fused = FusedEmbedding(dt.shapes, kernel, device, lr=0.01, init=0.01, optimizer=optimizer,
                              weights_buffer=buffer, weights_precision=weights_precision)
    dt.prepared = dt.fused.prepare(dt.inputs)
    _run_once(dt.fused, dt.prepared)


def _sized_runs(bench: KernelBenchmark, dt: DeviceTimes, repeats: int, min_pass_ms: float, max_repeats: int) -> int:
    """The sizing run of a built device (``repeats`` runs, not counted): its runs per pass
    (``_pass_repeats``)."""
    return _pass_repeats(bench.time_fused(dt.fused, dt.prepared, repeats).cost_ms, repeats, min_pass_ms, max_repeats)


def _pin_thread() -> set[int] | None:
    """Pin this thread to one core (the last it may use); returns the previous set."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(previous)})
    return previous


def time_devices(devices: Sequence[Sequence[Shard]], tables: TableSet, *, passes: int = TIMING_PASSES,
                 warmup_passes: int = TIMING_WARMUP_PASSES, repeats: int = TIMING_REPEATS,
                 batch_size: int = MEASURED_BATCH_SIZE, row_cap: int = DEFAULT_MAX_ROWS, kernel: str = "auto",
                 backend: str = "cpu", optimizer: str = "exact_sgd", max_memory_bytes: int | None = None,
                 progress: bool | str = False, weights_precision: str = "fp32",
                 flush_bytes: int | None = None, min_pass_ms: float = TIMING_MIN_PASS_MS,
                 max_repeats: int = TIMING_MAX_REPEATS,
                 reference: bool = TIMING_REFERENCE,
                 huge_pages: bool = TIMING_HUGE_PAGES) -> tuple[list[list[float]], dict]:
    """Time each device's shards (a list of shard lists, one per device, of any plans)
    as one fused kernel with weights of ``weights_precision``, the devices taking turns
    round-robin with the order rotated every pass. Returns per device its time (ms) in
    each measured pass (empty for a device without shards), and how the run was made.
    ``flush_bytes``: the cache flush before every timed run (None: the kernel benchmark's
    default, larger than the last-level cache; 0: none, a warm cache as in training, where
    a device's hot rows stay cached from one iteration to the next). ``min_pass_ms`` and
    ``max_repeats``: a device whose sizing run (``repeats`` runs, not counted) is shorter runs
    more per pass, its first pass included, up to ``max_repeats`` runs, so that a pass adds up
    to about ``min_pass_ms``. ``reference`` (two or more devices with shards): time a reference
    device right before every turn and return each pass relative to it (see the module
    docstring); ``config["figure"]`` says how a device's figure is made (``device_time``).
    ``huge_pages``: advise the CPU weights buffer into transparent huge pages, or out of them
    (module docstring)."""
    import torch  # heavy: imported when a run starts, so the CLI starts fast
    from tqdm import tqdm

    for name, value, low in (("passes", passes, 1), ("warmup_passes", warmup_passes, 0), ("repeats", repeats, 1),
                             ("row_cap", row_cap, 1), ("batch_size", batch_size, 1),
                             ("max_repeats", max_repeats, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise NeuroShardError(f"{name} must be an integer >= {low}, got {value!r}")
    if not isinstance(min_pass_ms, (int, float)) or isinstance(min_pass_ms, bool) or not min_pass_ms >= 0:
        raise NeuroShardError(f"min_pass_ms must be a number >= 0, got {min_pass_ms!r}")
    kernel = resolve_kernel(kernel, backend)
    # No warm-up run per turn: every kernel runs once when it is built, and after the
    # cache flush each timed run starts as cold as the first would.
    bench = KernelBenchmark(backend=backend, kernel=kernel, batch_size=batch_size, max_rows=row_cap,
                            warmup=0, repeats=repeats, max_repeats=repeats, optimizer=optimizer,
                            weights_precision=weights_precision, flush_bytes=flush_bytes)
    element_bytes = WEIGHTS_PRECISIONS[weights_precision]
    turns = [_device_times(shards, tables, batch_size, row_cap) for shards in devices]
    capped = len({(s.table, s.row_offset, s.num_rows) for dt in turns
                  for (r, _), s in zip(dt.shapes, dt.shards) if r < s.num_rows})
    need = max((weights_numel(dt.shapes, kernel) for dt in turns if dt.shards), default=0)
    limit = max_memory_bytes if max_memory_bytes is not None else int(MEMORY_SHARE * available_memory_bytes())
    if need * element_bytes > limit:
        raise NeuroShardError(f"the largest device needs {need * element_bytes / 2**30:.1f} GiB of weights with rows capped at "
                              f"{row_cap:,}, over the {limit / 2**30:.1f} GiB allowed; lower --row-cap")
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    buffer = None
    if backend == "cpu" and need:
        buffer = torch.empty((need,), dtype=weights_dtype(weights_precision))
        advise_huge_pages(buffer, huge_pages)  # before the first write maps the pages
        buffer.fill_(0.01)  # written once: pages mapped

    busy = [dt for dt in turns if dt.shards]
    ref = None
    if reference and len(busy) > 1:  # a kernel of its own on the median device's shards and lookups
        chosen = busy[int(np.argsort([_work(dt) for dt in busy], kind="stable")[len(busy) // 2])]
        ref = DeviceTimes(chosen.shards, chosen.shapes, chosen.inputs)
    total_passes = warmup_passes + passes
    start = time.perf_counter()
    pinned = _pin_thread() if backend == "cpu" else None
    bar = None
    if progress:
        bar = tqdm(total=total_passes * len(busy), desc=progress if isinstance(progress, str) else "measure",
                   unit="device", leave=False, disable=None)
    try:
        ref_runs = 0
        if ref is not None:
            _build(ref, kernel, device, optimizer, buffer, weights_precision)
            ref_runs = math.ceil(TIMING_REFERENCE_SHARE * _sized_runs(bench, ref, repeats, min_pass_ms, max_repeats))
        for pass_ in range(total_passes):
            shift = (pass_ * max(1, len(busy) // total_passes)) % max(1, len(busy))
            for dt in busy[shift:] + busy[:shift]:
                if dt.fused is None:
                    _build(dt, kernel, device, optimizer, buffer, weights_precision)
                if dt.repeats is None:  # the sizing run: a short device runs more per pass (about min_pass_ms)
                    dt.repeats = _sized_runs(bench, dt, repeats, min_pass_ms, max_repeats)
                counted = pass_ >= warmup_passes
                if ref is not None and counted:  # the reference's turn, right before the device's
                    dt.reference_ms.append(bench.time_fused(ref.fused, ref.prepared, ref_runs).cost_ms)
                measured = bench.time_fused(dt.fused, dt.prepared, dt.repeats)
                if counted:
                    dt.passes_ms.append(measured.cost_ms)
                if backend == "cuda":  # on CUDA, a device's weights live only for its turn
                    dt.fused = dt.prepared = None
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if pinned is not None:
            os.sched_setaffinity(0, pinned)
    figure, reported = "fastest", [list(dt.passes_ms) for dt in turns]
    if ref is not None:  # each pass at the reference's fastest turn: the machine's quietest speed in this run
        every = [r for dt in busy for r in dt.reference_ms]
        floor = min(every)
        reported = [[ms * floor / r for ms, r in zip(dt.passes_ms, dt.reference_ms)] for dt in turns]
        figure = "median"
    config = {"backend": backend, "hardware": cpu_model() if backend == "cpu" else torch.cuda.get_device_name(),
              "kernel": kernel, "clock": bench.clock, "optimizer": optimizer, "batch_size": batch_size,
              "passes": passes, "warmup_passes": warmup_passes, "repeats": repeats,
              "most_repeats": max((dt.repeats or repeats for dt in busy), default=repeats), "row_cap": row_cap,
              "capped_shards": capped, "buffer_bytes": need * element_bytes, "flush_bytes": bench.flush_bytes,
              "figure": figure, "seconds": round(time.perf_counter() - start, 2)}
    if backend == "cpu":  # what the weights got, read back from the kernel
        config["huge_pages"] = buffer is not None and huge_page_bytes(buffer) > 0
    if ref is not None:
        config["reference"] = {"device": next(i for i, dt in enumerate(turns) if dt is chosen), "runs": ref_runs,
                               "fastest_ms": round(floor, 4), "median_ms": round(float(np.median(every)), 4)}
    if weights_precision != "fp32":
        config["weights_precision"] = weights_precision
    return reported, config
