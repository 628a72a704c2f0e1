"""Cached shards in the runtime: rows in host memory or on SSD, a bounded cache on the device.

A shard whose tier is not device memory (``Shard.tier``, ``neuroshard.tiers``) keeps all of its
(allocated) rows in a **backing store**: a tensor in host memory (``memory: "host"``) or a
``numpy.memmap`` file in a temporary folder (``"ssd"``; the system's, ``TMPDIR``), removed by
``close``. It trains on a **device cache** of ``C = tier.cache_rows(rows)`` slots. Per batch
(``CachedShards.prepare``, before the timed compute, as fbgemm's prefetch runs before the
kernel; the cache and its moves are ``costmodels.samples.tiers.LruRows``, which
``search --tier-costs measured`` also times to cost such plans):

1. the batch's unique row ids in the shard: those in the cache are hits, the others misses
   (the miss rate of ``datasets.cache_model``: the share of a batch's unique ids not in the
   cache before the batch);
2. LRU at batch granularity: every row of a batch shares its last use; the cache before a
   batch holds the ``C`` most recently used rows, a tie at its edge (rows of one batch) broken
   by a random key drawn when the batch used them (each row of the group as likely to stay as
   any other, as ``replay_miss_rates`` counts it). Rows falling out are written back to the
   backing store (every cached row was updated, so every evicted row is dirty);
3. the misses are loaded from the backing store into free slots, and the batch's ids are
   remapped onto slots.

A batch with more unique rows than ``C`` gets transient slots for the excess (fbgemm reads such
rows over the host link instead); the cache keeps the ``C`` most recent, the others are written
back before the next batch. A shard without ``cache_fraction`` (``fused_uvm``: no cache) has
``C = 0``: every batch's rows are loaded and written back, a miss rate of 1.

The cached shards of a rank are looked up by ``F.embedding_bag`` over their slots (sum pooling,
sparse gradient) and updated by SGD on the slot rows: the arithmetic of the fused kernel's exact
SGD, so a run with cached shards reproduces the run with every row on the device (fp32: to float
tolerance). The device shards keep the fused kernel. Only ``sgd`` trains cached shards (another
optimizer's state would have to travel with the rows: ``check_cached_plan``).

What is counted per step and shard: unique rows looked up, misses, and the seconds of the miss
path (choosing the rows to evict, writing them back and loading missed rows), measured on this
machine's CPU and memory (an SSD backing store is a memory-mapped file: reads and writes go through the OS page
cache, not to the drive each time). ``cache_summary`` turns the runtime's per-step records into
per-table figures over the second half of the steps (the first half warms the cache, as
``replay_miss_rates`` counts).
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..costmodels.samples.tiers import LruRows, read_rows, write_rows
from ..errors import InvalidPlanError, NeuroShardError
from ..execution.kernels import weights_dtype
from ..optimizers import check_optimizer
from ..plan import Plan, Shard
from ..tables import Table
from .memory import HeldMemory, storage_bytes
from .model import init_rows

log = logging.getLogger(__name__)

#: rows initialised at a time when filling a backing store (bounds the temporary tensor)
FILL_CHUNK_ROWS = 1 << 16


def check_cached_plan(plan: Plan) -> None:
    """Refuse a plan whose cached shards the runtime cannot train (one line): only ``sgd``
    trains shards outside device memory here."""
    tiered = sorted({s.table for s in plan.shards if not s.tier.on_device})
    if tiered and check_optimizer(plan.optimizer) != "sgd":
        raise InvalidPlanError(f"table '{tiered[0]}' keeps its rows in {plan.tiers()[tiered[0]].label()}: the runtime "
                               f"trains such shards with sgd only, the plan's optimizer is {plan.optimizer}")


class BackingStore:
    """All rows of one shard outside the device: a host tensor (``host``) or a memory-mapped
    file (``ssd``) in a temporary folder of its own, removed by ``close``."""

    def __init__(self, memory: str, rows: int, width: int, dtype: torch.dtype, where: str) -> None:
        self.memory, self.rows, self.width, self.dtype = memory, rows, width, dtype
        self.folder: str | None = None
        self._finalizer = None
        if memory == "host":
            try:
                self._host = torch.empty(rows, width, dtype=dtype)
            except (RuntimeError, MemoryError) as exc:
                raise NeuroShardError(f"{where}: cannot allocate its {rows:,} x {width} rows in host memory: "
                                      f"{str(exc).splitlines()[0]}") from None
            return
        np_dtype = np.float16 if dtype == torch.float16 else np.float32
        try:
            self.folder = tempfile.mkdtemp(prefix="neuroshard-ssd-")
            self._finalizer = weakref.finalize(self, shutil.rmtree, self.folder, True)
            self._file = np.memmap(f"{self.folder}/rows.bin", dtype=np_dtype, mode="w+", shape=(rows, width))
        except (OSError, ValueError) as exc:
            self.close()
            raise NeuroShardError(f"{where}: cannot create its SSD backing file of {rows:,} x {width} rows in "
                                  f"{tempfile.gettempdir()}: {str(exc).splitlines()[0]}") from None

    @property
    def rows_store(self) -> "torch.Tensor | np.memmap":
        """The rows themselves: what the miss path's moves (``costmodels.samples.tiers``) act on."""
        return self._host if self.memory == "host" else self._file

    def read(self, ids: np.ndarray) -> torch.Tensor:
        """Rows ``ids`` (a copy, host memory)."""
        return read_rows(self.rows_store, ids)

    def write(self, ids: np.ndarray, values: torch.Tensor) -> None:
        """Set rows ``ids`` to ``values`` (rows x width, any device)."""
        write_rows(self.rows_store, ids, values)

    def fill(self, start: int, values: torch.Tensor) -> None:
        """Set rows ``[start, start + len(values))``."""
        if self.memory == "host":
            self._host[start:start + values.shape[0]] = values.to(self.dtype)
        else:
            self._file[start:start + values.shape[0]] = values.to(self.dtype).numpy()

    def all_rows(self) -> torch.Tensor:
        """Every row, float32 (a copy)."""
        if self.memory == "host":
            return self._host.to(torch.float32, copy=True)
        return torch.from_numpy(np.array(self._file, dtype=np.float32))

    def close(self) -> None:
        """Drop the rows; an SSD store removes its file and folder."""
        if self.memory != "host":
            self._file = None
            if self._finalizer is not None:
                self._finalizer()  # removes the folder, once


class CachedShard:
    """One shard's backing store and its device cache (``LruRows``: the slots and their LRU state)."""

    def __init__(self, shard: Shard, table: Table, rows: int, seed: int, device: torch.device,
                 dtype: torch.dtype, rng: np.random.Generator) -> None:
        self.shard, self.rows, self.width = shard, rows, shard.num_cols
        self.capacity = shard.tier.cache_rows(rows)  # C; 0 without a cache (fused_uvm)
        self.device, self.dtype = device, dtype
        where = (f"table '{shard.table}' rows [{shard.row_offset:,}, {shard.row_offset + shard.num_rows:,}) "
                 f"({shard.tier.label()})")
        self.backing = BackingStore(shard.tier.memory, rows, self.width, dtype, where)
        for start in range(0, rows, FILL_CHUNK_ROWS):
            n = min(FILL_CHUNK_ROWS, rows - start)
            self.backing.fill(start, init_rows(table, seed, shard.row_offset + start, n, shard.col_offset, self.width))
        self.cache = LruRows(self.backing.rows_store, rows, self.width, self.capacity, device, dtype, rng)

    @property
    def slots(self) -> torch.Tensor:
        """The cache's rows (slots x width, on the device; trained in place)."""
        return self.cache.slots

    def prepare(self, ids: torch.Tensor) -> tuple[torch.Tensor, int, int, float]:
        """Bring the rows ``ids`` (local, allocated rows) into the cache: (the ids remapped onto
        slots, unique rows, misses, seconds of the miss path)."""
        local = ids.cpu().numpy()
        unique = np.unique(local)
        misses, _, seconds = self.cache.bring(unique)
        return torch.from_numpy(self.cache.row_slot[local]).to(self.device), int(unique.size), misses, seconds

    def step(self, lr: float) -> None:
        """SGD on the rows the batch looked up (the slots' sparse gradient)."""
        grad = self.slots.grad
        if grad is not None:
            with torch.no_grad():
                self.slots.add_(grad, alpha=-lr)
            self.slots.grad = None

    def weights(self) -> np.ndarray:
        """The shard's current weights, (rows, width) float32: the backing store with the
        cached rows over it (the cache is not written back: training may go on)."""
        out = self.backing.all_rows()
        held = np.flatnonzero(self.cache.slot_row >= 0)
        if held.size:
            out[torch.from_numpy(self.cache.slot_row[held])] = self.slots.detach()[torch.from_numpy(held).to(
                self.device)].to("cpu", torch.float32)
        return out.numpy()

    def close(self) -> None:
        self.cache.store = None
        self.backing.close()


class CachedShards:
    """A rank's cached shards: per batch, the cache moves and the lookups remapped onto slots
    (``prepare``), the pooled lookup (``pooled``) and the SGD update (``step``). Counts of
    each batch are in ``last_counts``: table -> [unique rows, misses, miss-path seconds],
    summed over the table's cached shards here."""

    def __init__(self, shards: Sequence[tuple[Shard, int]], tables: dict[str, Table], seed: int,
                 device: torch.device, lr: float, weights_precision: str) -> None:
        self.lr = lr
        dtype = weights_dtype(weights_precision)
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCAC4E]))
        self.shards = [CachedShard(s, tables[s.table], rows, seed, device, dtype, rng) for s, rows in shards]
        self._inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.last_counts: dict[str, list[float]] = {}

    def prepare(self, per_shard: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Bring one batch's rows into the caches (``per_shard``: each cached shard's local
        (indices, offsets)) and keep the remapped lookups for ``pooled``."""
        self._inputs, counts = [], {}
        for cs, (idx, off) in zip(self.shards, per_shard):
            slots, unique, misses, seconds = cs.prepare(idx)
            self._inputs.append((slots, off.to(cs.device)))
            c = counts.setdefault(cs.shard.table, [0, 0, 0.0])
            c[0], c[1], c[2] = c[0] + unique, c[1] + misses, c[2] + seconds
        self.last_counts = counts

    def pooled(self) -> torch.Tensor:
        """(B, widths of the cached shards) pooled embeddings, in shard order."""
        return torch.cat([F.embedding_bag(idx, cs.slots, off, mode="sum", sparse=True).float()
                          for cs, (idx, off) in zip(self.shards, self._inputs)], dim=1)

    def step(self) -> None:
        for cs in self.shards:
            cs.step(self.lr)

    def weights(self) -> list[np.ndarray]:
        return [cs.weights() for cs in self.shards]

    def held(self) -> HeldMemory:
        """The storage these shards hold (``runtime.memory``): on the device each cache's slots
        and its slot map (the row each slot holds), the slots beyond its capacity apart; the
        backing stores by tier; the rest of the caches' state, indexed by all of a shard's rows
        (its slot, its LRU order), as the cache index."""
        out = HeldMemory()
        for cs in self.shards:
            on_device = storage_bytes([cs.cache.slots, cs.cache.slot_row])
            slots = cs.cache.slots.shape[0]
            store = storage_bytes([cs.backing])
            out.device_bytes += on_device
            out.excess_slot_bytes += on_device * max(slots - cs.capacity, 0) // slots
            out.backing_bytes[cs.shard.tier.memory] = out.backing_bytes.get(cs.shard.tier.memory, 0) + store
            out.cache_index_bytes += storage_bytes([cs.cache, cs.backing]) - on_device - store
        return out

    def close(self) -> None:
        for cs in self.shards:
            cs.close()


def cache_summary(plan: Plan, records: Sequence[Sequence[dict]], which: int = 0) -> dict[str, dict]:
    """Per cached table of ``plan`` (plan number ``which`` of the run), over the second half
    of its steps (the first warms the caches): unique rows looked up and misses summed over
    the table's cached shards and those steps, the miss rate, and the miss path's mean
    milliseconds per step (all its shards, measured on this CPU). Empty without cached shards."""
    tiers = {name: tier for name, tier in plan.tiers().items() if not tier.on_device}
    if not tiers:
        return {}
    out = {}
    for name, tier in tiers.items():
        unique = misses = seconds = 0.0
        steps = 0
        for rank_records in records:
            mine = [r for r in rank_records if r.get("plan", 0) == which]
            kept = mine[len(mine) // 2:]
            steps = max(steps, len(kept))
            for r in kept:
                c = r.get("cache", {}).get(name)
                if c is not None:
                    unique, misses, seconds = unique + c[0], misses + c[1], seconds + c[2]
        out[name] = {"tier": tier.label(), "memory": tier.memory, "cache_fraction": tier.cache_fraction,
                     "cache_rows": sum(tier.cache_rows(s.num_rows) for s in plan.shards_of(name)),
                     "steps": steps, "lookups_unique": int(unique), "misses": int(misses),
                     "miss_rate": misses / unique if unique else 0.0,
                     "miss_path_ms_per_step": 1e3 * seconds / steps if steps else 0.0}
    return out


def format_cache(summary: dict[str, dict]) -> str:
    """Lines of ``neuroshard evaluate``'s report: one per cached table."""
    if not summary:
        return ""
    steps = max(v["steps"] for v in summary.values())
    lines = [(f"cached tables (LRU, the last {steps} steps; miss path: writing evicted rows back and loading "
              f"missed rows, all the table's shards, measured on this CPU, not in total_ms):")]
    width = max(len(name) for name in summary)
    for name, v in summary.items():
        lines.append(f"  {name:<{width}}  {v['tier']:<16} {v['cache_rows']:>9,} cached rows  miss rate "
                     f"{v['miss_rate']:.3f} ({v['misses']:,} of {v['lookups_unique']:,} unique rows)  "
                     f"miss path {v['miss_path_ms_per_step']:.3f} ms/step")
    return "\n".join(lines)
