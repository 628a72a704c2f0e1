"""Cost-data collection: random augmented shard sets and width/skew samples, resumable.

Sample ``i`` of a run with seed ``S`` is drawn from ``numpy.random.default_rng(S + i)``
alone, so a rerun into the same folder skips the samples already on disk and
measures exactly the missing ones: nothing is lost or duplicated, even after
``kill -9``.

Shard sets follow the paper's augmentation: 1..K tables drawn from a tables
file, each cut to a width from the halving ladder ``dims`` (4, 8, ..., 128,
capped by the table's width), kept only while the set fits the per-device memory
cap. With probability ``row_split_prob`` a shard is also a row-wise slice
(1/2, 1/4 or 1/8 of the rows) so row-wise shards are in the data too.

Under ``torchrun`` (``rank``/``world_size`` given, ``world_size > 1``) rank ``r``
measures the samples ``i`` with ``i % world_size == r`` into its own part file
(``store.part_file``), as crash-safe and resumable as the main file; no process
group is needed. Readers merge the parts (``store``); ``store.merge_parts`` folds
them into the main file.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..constants import COLLECT_SET_SOURCES, FP32_BYTES, MEASURED_BATCH_SIZE
from ..costmodels.samples import store
from ..costmodels.samples.comm import CommBenchmark
from ..costmodels.samples.kernel import KernelBenchmark
from ..datasets.sampler import shard_table
from ..errors import NeuroShardError
from ..io import append_jsonl, repair_jsonl_tail
from ..tables import Table, TableSet
from ..units import format_bytes
from ..validate import (
    MAX_DEVICES,
    MAX_JSON_BYTES,
    MAX_STEPS,
    check_batch_size,
    check_int,
    check_memory,
    check_number,
    check_output_folder,
    check_seed,
    read_bounded,
)
from .calibration_sets import MAX_SET_BYTES
from .plan_sets import PlanSetSampler

log = logging.getLogger(__name__)

SET_SOURCES = COLLECT_SET_SOURCES


def parse_dims(text: str) -> list[int]:
    """``"4..128"`` -> [4, 8, 16, 32, 64, 128]; ``"16,32,64"`` -> [16, 32, 64]."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split(".."))
            if lo < 1 or hi < lo:
                raise ValueError
            dims, w = [], hi
            while w >= lo:
                dims.append(w)
                w //= 2
            return sorted(dims)
        dims = sorted({int(x) for x in text.split(",")})
        if not dims or dims[0] < 1:
            raise ValueError
        return dims
    except ValueError:
        raise NeuroShardError(f"cannot read widths from {text!r} (use e.g. 4..128 or 16,32,64)") from None


def sample_shard_set(tables: Sequence[Table], rng: np.random.Generator, max_tables: int, memory_bytes: int,
                     batch_size: int, dims: Sequence[int], row_split_prob: float = 0.2) -> list[Table]:
    """One random shard set (shards as tables, with ``extra['source_table']``) under the memory cap."""
    for _ in range(100):
        k = int(rng.integers(1, max_tables + 1))
        chosen = rng.choice(len(tables), size=min(k, len(tables)), replace=False)
        shards, used = [], 0
        for index in chosen:
            table = tables[int(index)]
            widths = [w for w in dims if w <= table.embedding_dim] or [table.embedding_dim]
            rows, row_offset = table.num_embeddings, 0
            if rng.random() < row_split_prob and table.num_embeddings >= 16:
                parts = 2 ** int(rng.integers(1, 4))
                part = int(rng.integers(0, parts))
                row_offset = part * (table.num_embeddings // parts)
                rows = table.num_embeddings // parts if part < parts - 1 else table.num_embeddings - row_offset
            width = int(rng.choice(widths))
            fitting = [w for w in widths if used + rows * w * FP32_BYTES <= memory_bytes]
            if not fitting:
                continue
            if width not in fitting:
                width = int(rng.choice(fitting))
            shard = shard_table(table, row_offset, rows, 0, width, batch_size)
            shard.extra = {**shard.extra, "source_table": table.name}
            shards.append(shard)
            used += shard.size_bytes(4)
        if shards:
            return shards
    raise NeuroShardError(f"no shard set of these tables fits a device of {format_bytes(memory_bytes)}")


def check_memory_fits(tables: Sequence[Table], memory_bytes: int, dims: Sequence[int], row_split_prob: float,
                      source: str = "tables") -> None:
    """Refuse, before anything is measured or written, a memory cap that no shard of any
    table fits (the smallest: its narrowest width, its smallest row slice)."""
    def smallest(t: Table) -> int:
        rows = t.num_embeddings // 8 if row_split_prob > 0 and t.num_embeddings >= 16 else t.num_embeddings
        width = min([w for w in dims if w <= t.embedding_dim] or [t.embedding_dim])
        return rows * width * FP32_BYTES
    table = min(tables, key=smallest)
    if smallest(table) > memory_bytes:
        raise NeuroShardError(f"--memory {format_bytes(memory_bytes)} holds no shard of {source}: the smallest, of "
                              f"table '{table.name}', needs {format_bytes(smallest(table))}")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(read_bounded(path, MAX_JSON_BYTES, "tables file")).hexdigest()[:16]


def _progress(total: int, initial: int, desc: str):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit="sample", dynamic_ncols=True, mininterval=2.0)


def collect_compute(tables_path: str | Path, samples: int, out: str | Path, *, max_tables: int = 8,
                    memory_bytes: int = 1 << 30, batch_size: int = MEASURED_BATCH_SIZE, dims: Sequence[int] = (4, 8, 16, 32, 64, 128),
                    seed: int = 0, row_split_prob: float = 0.2, progress: bool = True,
                    max_minutes: float | None = None, sets: str = "random", rank: int = 0, world_size: int = 1,
                    local_rank: int | None = None, **bench_kwargs) -> int:
    """Measure shard sets ``0..samples-1`` into ``out/compute.jsonl`` (stopping cleanly after
    ``max_minutes`` if given; a rerun continues); returns how many were measured now.
    ``sets="plans"``: devices of searched plans instead of random sets (``plan_sets``).
    ``rank`` of ``world_size`` (torchrun's): measure only the samples ``i % world_size ==
    rank``, into this rank's part file, on CUDA on device ``local_rank`` (default ``rank``)."""
    check_int(samples, "samples", 1, MAX_STEPS)
    check_int(world_size, "world size", 1, MAX_DEVICES)
    check_int(rank, "rank", 0, world_size - 1)
    check_int(max_tables, "max tables per device", 1, 1024)
    memory_bytes = check_memory(memory_bytes)
    check_batch_size(batch_size)
    check_seed(seed)
    check_number(row_split_prob, "row split probability", 0.0, 1.0)
    if sets not in SET_SOURCES:
        raise NeuroShardError(f"unknown shard-set source {sets!r}; choose one of {', '.join(SET_SOURCES)}")
    if not dims or not all(isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 2**14 for w in dims):
        raise NeuroShardError(f"widths must be integers in [1, {2**14}], got {list(dims)!r}")
    tables_path = Path(tables_path)
    tables = TableSet.read(tables_path)
    check_memory_fits(tables.tables, memory_bytes, dims, row_split_prob, str(tables_path))
    if world_size > 1 and bench_kwargs.get("backend") == "cuda":
        _pin_cuda_device(rank if local_rank is None else local_rank)
    bench = KernelBenchmark(batch_size=batch_size, memory_bytes=memory_bytes, **bench_kwargs)
    config = {**bench.config(), "memory_bytes": memory_bytes, "max_tables_per_device": max_tables,
              "dims": list(dims), "seed": seed, "row_split_prob": row_split_prob,
              "tables": tables_path.name, "tables_sha256": _file_sha256(tables_path)}
    if sets == "plans":
        config["sets"] = sets
        plan_set = PlanSetSampler(tables.tables, batch_size, seed, MAX_SET_BYTES, bench.max_rows)

    def measure(i: int) -> tuple[dict, dict]:
        if sets == "plans":
            shards = plan_set(i)
        else:
            rng = np.random.default_rng(seed + i)
            shards = sample_shard_set(tables.tables, rng, max_tables, memory_bytes, batch_size, dims, row_split_prob)
        m = bench.measure(shards)
        record = {"sample": i, "batch_size": batch_size, "kernel": m.kernel,
                  "shards": [s.to_dict() for s in shards], "cost_ms": round(m.cost_ms, 5),
                  "fwd_ms": round(m.fwd_ms, 5), "times_ms": m.times_ms, "cv": round(m.cv, 5)}
        return record, {"cost_ms": f"{m.cost_ms:.2f}", "cv": f"{m.cv:.3f}"}

    return _collect(Path(out), "compute", store.COMPUTE_FILE, store.hardware_info(bench.backend), config, samples,
                    measure, "compute" if world_size == 1 else f"compute rank {rank}/{world_size}", progress, max_minutes,
                    rank=rank, world_size=world_size)


def _pin_cuda_device(local_rank: int) -> None:
    """Make ``cuda`` mean this rank's GPU (torchrun's ``LOCAL_RANK``) for the rest of the process."""
    import torch
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())


def _collect(out: Path, kind: str, filename: str, hardware: dict, config: dict, samples: int,
             measure: Callable[[int], tuple[dict, dict]], desc: str, progress: bool, max_minutes: float | None,
             running: contextlib.AbstractContextManager = contextlib.nullcontext(), rank: int = 0,
             world_size: int = 1) -> int:
    """The resumable loop of every collection: under the file's lock, check or write the
    folder's ``meta.json`` (and check its parts), then ``measure(i)`` each sample not yet in
    the folder (a record and progress-bar figures) and append its record, stopping cleanly
    after ``max_minutes``. With ``world_size > 1`` only the samples ``i % world_size == rank``,
    into this rank's part (described on its first line; ``meta.json`` by rank 0 only).
    ``running`` (e.g. the benchmark's processes) is entered only when there is work.
    Returns how many samples were measured now."""
    check_output_folder(out, "cost-data folder")
    part = world_size > 1
    target = out / (store.part_file(filename, rank, world_size) if part else filename)
    ignore = store.PART_IGNORED_HARDWARE if part else ()
    with store.locked(out, target.name):
        meta, old = store.check_meta(out, kind, hardware, store.software_info(), config, ignore)
        mine = store.describe(kind, hardware, store.software_info(), config) if part else meta
        store.check_parts(out, filename, mine)
        torn = repair_jsonl_tail(target)
        if torn:
            log.warning("%s: cut a torn last record (%d bytes) left by an interrupted run", target, torn)
        headed = not part or store.part_header(target) is not None
        describes = rank == 0  # only one writer of meta.json
        done = store.done_samples(out, filename)
        if describes and old is None and done:  # records from a run killed before it wrote meta.json
            store.write_meta(out, meta)
            old = meta
        share = [i for i in range(samples) if i % world_size == rank]
        todo = [i for i in share if i not in done]
        where = f"{out} (rank {rank} of {world_size})" if part else str(out)
        log.info("%s: %d of %d samples already in %s, %d to measure", kind, len(share) - len(todo), len(share),
                 where, len(todo))
        if not todo:
            return 0
        bar = _progress(len(share), len(share) - len(todo), desc) if progress else None
        deadline = _deadline(max_minutes)
        measured = 0
        try:
            with running:
                for i in todo:
                    if time.monotonic() > deadline:
                        log.warning("%s: time limit reached after %d samples; rerun to continue", kind, measured)
                        break
                    record, postfix = measure(i)
                    if not headed:  # a part says what it holds before its first record
                        store.write_part_header(target, mine, rank, world_size)
                        headed = True
                    append_jsonl(target, record)
                    if describes and old is None:  # described once a first record is on disk
                        store.write_meta(out, meta)
                        old = meta
                    measured += 1
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(**postfix, refresh=False)
        finally:
            if bar is not None:
                bar.close()
    return measured


def _deadline(max_minutes: float | None) -> float:
    return float("inf") if not max_minutes else time.monotonic() + 60.0 * max_minutes


def sample_comm(rng: np.random.Generator, num_devices: int, max_width: int, max_skew_ms: float,
                max_reduce_width: int) -> tuple[list[int], list[float], int]:
    """Random per-device widths (multiples of 4), start skews (ms; all zero in 1/4 of the
    samples, the earliest device always at 0) and row-wise reduce width."""
    widths = [int(w) * 4 for w in rng.integers(1, max_width // 4 + 1, size=num_devices)]
    if rng.random() < 0.25 or max_skew_ms <= 0:
        skews = [0.0] * num_devices
    else:
        raw = rng.uniform(0.0, max_skew_ms, size=num_devices)
        skews = [round(float(s), 3) for s in raw - raw.min()]
    reduce_width = 0 if rng.random() < 0.3 or max_reduce_width < 4 else int(rng.integers(1, max_reduce_width // 4 + 1)) * 4
    return widths, skews, reduce_width


def collect_comm(num_devices: int, samples: int, out: str | Path, *, batch_size: int = MEASURED_BATCH_SIZE,
                 max_width: int = 2048, max_skew_ms: float = 30.0, max_reduce_width: int = 256, seed: int = 0,
                 backend: str = "cpu", warmup: int = 2, repeats: int = 7, timeout_s: float = 60.0,
                 progress: bool = True, max_minutes: float | None = None) -> int:
    """Measure width/skew samples ``0..samples-1`` into ``out/comm.jsonl`` (stopping cleanly after
    ``max_minutes`` if given); returns how many were measured now."""
    check_int(num_devices, "devices", 2, MAX_DEVICES)
    check_int(samples, "samples", 1, MAX_STEPS)
    if not (isinstance(max_width, int) and 4 <= max_width <= 2**20):
        raise NeuroShardError(f"max_width must be an integer in [4, {2**20}], got {max_width!r}")
    check_batch_size(batch_size)
    check_number(max_skew_ms, "max skew (ms)", 0.0, 60000.0)
    check_int(max_reduce_width, "max reduce width", 0, 2**20)
    check_seed(seed)
    check_int(warmup, "warmup", 0, 10000)
    check_int(repeats, "repeats", 1, 10000)
    check_number(timeout_s, "timeout (seconds)", 1.0, 86400.0)
    bench = CommBenchmark(num_devices, backend=backend, batch_size=batch_size, warmup=warmup, repeats=repeats,
                          timeout_s=timeout_s)
    config = {**bench.config(), "max_width": max_width, "max_skew_ms": max_skew_ms,
              "max_reduce_width": max_reduce_width, "seed": seed, "clock": "wall"}

    def measure(i: int) -> tuple[dict, dict]:
        rng = np.random.default_rng(seed + i)
        widths, skews, reduce_width = sample_comm(rng, num_devices, max_width, max_skew_ms, max_reduce_width)
        m = bench.measure(widths, skews, reduce_width)
        r4 = lambda xs: [round(x, 4) for x in xs]  # noqa: E731
        record = {"sample": i, "num_devices": num_devices, "batch_size": batch_size, "widths": widths,
                  "skews_ms": skews, "reduce_width": reduce_width, "fwd_ms": r4(m.fwd_ms),
                  "bwd_ms": r4(m.bwd_ms), "reduce_ms": r4(m.reduce_ms), "cv_fwd": round(m.cv_fwd, 5)}
        return record, {"fwd_ms": f"{max(m.fwd_ms):.2f}", "cv": f"{m.cv_fwd:.3f}"}

    return _collect(Path(out), "comm", store.COMM_FILE, store.hardware_info(backend), config, samples, measure,
                    f"comm D={num_devices}", progress, max_minutes, running=bench)
