"""The miss path of a cached shard, measured on this machine's CPU and memory.

A shard whose rows live outside the device (``neuroshard.tiers``) keeps them in a **backing
store** and trains on a cache of slots (``LruRows``: LRU at batch granularity); per batch the
rows falling out of the cache are written back (``write_back``) and the missed rows loaded
from the store into free slots (``load_rows``). The runtime's cached shards
(``runtime.cached``) are these objects and functions: what is measured here is their miss
path. A store is a host-memory tensor (``host``) or a ``numpy.memmap`` file (``ssd``; reads
and writes go through the OS page cache).

``measure_tier_costs`` times that miss path here, on one thread as the runtime's CPU ranks
run: per backing store, batches of ``k`` random rows of a store ``d`` wide brought into a
cache of ``k`` slots (every row a miss: ``k`` rows written back, ``k`` loaded, and the LRU's
bookkeeping), for a few ``(k, d)``; the median of each is fitted per store with a line
``ms = overhead_ms + bytes / (gbps x 1e6)`` (``bytes``: the rows moved both ways x row
bytes), least squares relative to each point's time, so small batches (the overhead) weigh
as much as large ones (the bandwidth). ``TierCostModel(measured=)`` costs tiers with the
lines. The measurement takes one to a few seconds (at most ``budget_s`` of batches, plus
filling the stores).

Heavy imports (torch) happen inside the functions that need them.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ...errors import NeuroShardError
from ..base import few_threads
from .store import cpu_model

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: (rows of a batch = slots of the cache, row width in elements) timed per backing store
TIER_SIZES: tuple[tuple[int, int], ...] = tuple((k, d) for d in (16, 64, 128) for k in (64, 1024, 8192))
#: each backing store has this many bytes (larger than a CPU's last-level cache on most machines)
STORE_BYTES = 32 << 20
#: timed batches per size (the median kept), after two untimed ones that fill the cache
TIER_REPEATS = 7
#: the measurement stops starting batches after this many seconds (a size then has fewer repeats)
TIER_BUDGET_S = 4.0
#: the element the runtime trains cached shards with here (fp32)
ELEMENT_BYTES = 4
#: the backing stores, by the tier whose rows they hold
BACKINGS = {"host": "host memory", "ssd": "memory-mapped file"}


# ------------------------------------------------------------------- moves
def read_rows(store: Any, ids: np.ndarray) -> "torch.Tensor":
    """Rows ``ids`` of ``store`` (a host tensor or a ``numpy.memmap``), a copy in host memory."""
    import torch
    if isinstance(store, torch.Tensor):
        return store[torch.from_numpy(ids)]
    return torch.from_numpy(np.asarray(store[ids]))


def write_rows(store: Any, ids: np.ndarray, values: "torch.Tensor") -> None:
    """Set rows ``ids`` of ``store`` to ``values`` (rows x width, any device), in the store's type."""
    import torch
    values = values.detach()
    if isinstance(store, torch.Tensor):
        store[torch.from_numpy(ids)] = values.to("cpu", store.dtype)
    else:
        store[ids] = values.to("cpu", torch.from_numpy(np.empty(0, dtype=store.dtype)).dtype).numpy()


def write_back(store: Any, rows: np.ndarray, slots: "torch.Tensor", slot_ids: np.ndarray) -> None:
    """Evicted rows to the store: ``store[rows] = slots[slot_ids]``."""
    import torch
    write_rows(store, rows, slots.detach()[torch.from_numpy(slot_ids).to(slots.device)])


def load_rows(store: Any, rows: np.ndarray, slots: "torch.Tensor", slot_ids: np.ndarray) -> None:
    """Missed rows into the cache: ``slots[slot_ids] = store[rows]`` (no autograd record)."""
    import torch
    with torch.no_grad():
        slots[torch.from_numpy(slot_ids).to(slots.device)] = read_rows(store, rows).to(slots.device)


class LruRows:
    """A device cache of ``capacity`` slots over the ``rows`` rows of a backing store
    (``store``): LRU at batch granularity (``runtime.cached``'s module docstring), the miss
    path of the runtime's cached shards. ``capacity`` 0: no cache (every batch's rows are
    loaded and written back; one slot kept, more added per batch)."""

    def __init__(self, store: Any, rows: int, width: int, capacity: int, device: Any, dtype: Any,
                 rng: np.random.Generator) -> None:
        import torch
        self.store, self.capacity, self.rng = store, int(capacity), rng
        self.width, self.device, self.dtype = width, device, dtype
        self.slots = torch.zeros(max(self.capacity, 1), width, dtype=dtype, device=device).requires_grad_()
        self.slot_row = np.full(self.slots.shape[0], -1, dtype=np.int64)  # row held by each slot (-1: free)
        self.row_slot = np.full(rows, -1, dtype=np.int64)                 # slot of each row (-1: not cached)
        self.last = np.full(rows, -1, dtype=np.int64)   # batch that last used each row
        self.tie = np.zeros(rows, dtype=np.float64)     # random order among rows of one batch
        self.batches = 0

    def _evict(self, rows: np.ndarray) -> int:
        if rows.size == 0:
            return 0
        slots = self.row_slot[rows]
        write_back(self.store, rows, self.slots, slots)
        self.slot_row[slots] = -1
        self.row_slot[rows] = -1
        return int(rows.size)

    def _oldest(self, rows: np.ndarray, count: int) -> np.ndarray:
        """The ``count`` least recently used of ``rows`` (ties by the batch's random keys)."""
        if count <= 0:
            return rows[:0]
        return rows[np.lexsort((self.tie[rows], self.last[rows]))[:count]]

    def _grow(self, slots: int) -> None:
        import torch
        extra = torch.zeros(slots - self.slots.shape[0], self.width, dtype=self.dtype, device=self.device)
        self.slots = torch.cat([self.slots.detach(), extra]).requires_grad_()
        self.slot_row = np.concatenate([self.slot_row, np.full(extra.shape[0], -1, dtype=np.int64)])

    def bring(self, unique: np.ndarray) -> tuple[int, int, float]:
        """Bring a batch's ``unique`` rows (sorted, as ``np.unique`` gives them) into the cache:
        (misses, rows moved: written back and loaded, seconds of the miss path)."""
        start = time.perf_counter()
        resident = self.slot_row[self.slot_row >= 0]
        # the cache before this batch: the C most recent rows (a batch's excess leaves now)
        moved = self._evict(self._oldest(resident, resident.size - self.capacity))
        missed = unique[self.row_slot[unique] < 0]
        # room for the misses: after this batch the cache holds its rows and the most recent others
        resident = self.slot_row[self.slot_row >= 0]
        others = resident[~np.isin(resident, unique, assume_unique=True)]
        keep = max(self.capacity - unique.size, 0)
        moved += self._evict(self._oldest(others, others.size - keep))
        need = unique.size + min(others.size, keep)
        if need > self.slots.shape[0]:
            self._grow(need)
        free = np.flatnonzero(self.slot_row < 0)[:missed.size]
        if missed.size:
            load_rows(self.store, missed, self.slots, free)
            self.slot_row[free] = missed
            self.row_slot[missed] = free
        seconds = time.perf_counter() - start
        self.last[unique] = self.batches
        self.tie[unique] = self.rng.random(unique.size)
        self.batches += 1
        return int(missed.size), moved + int(missed.size), seconds


# ------------------------------------------------------------------ record
@dataclass(frozen=True)
class MissPathLine:
    """A backing store's miss path: milliseconds per batch = ``overhead_ms`` + bytes moved
    (written back and loaded) / ``gbps``."""

    overhead_ms: float
    gbps: float

    def ms(self, bytes_moved: float, batches: float = 1.0) -> float:
        """Milliseconds of ``batches`` batches' miss paths (an expected count: a batch without
        misses has none) moving ``bytes_moved`` bytes in all (both ways together)."""
        return batches * self.overhead_ms + bytes_moved / (self.gbps * 1e6)


@dataclass(frozen=True)
class TierMeasurement:
    """The miss-path lines measured on ``hardware``: ``host`` (a host-memory tensor) and
    ``memmap`` (a memory-mapped file, what an ``ssd`` shard's store is here), with the
    timed points (backing -> [k, d, bytes, ms] rows)."""

    hardware: str
    host: MissPathLine
    memmap: MissPathLine
    points: dict = field(default_factory=dict, compare=False)

    def line(self, memory: str) -> MissPathLine:
        """The line of the store a tier's rows live in (``host`` or ``ssd``)."""
        if memory not in BACKINGS:
            raise NeuroShardError(f"no measured miss path for rows in {memory!r} (one of {', '.join(BACKINGS)})")
        return self.host if memory == "host" else self.memmap

    @property
    def source(self) -> str:
        """What the plan's provenance says about the tier costs."""
        return (f"measured on {self.hardware} (host memory {self.host.gbps:.2f} GB/s, memory-mapped file "
                f"{self.memmap.gbps:.2f} GB/s; per batch {1e3 * self.host.overhead_ms:.0f} and "
                f"{1e3 * self.memmap.overhead_ms:.0f} us): the included runtime's miss path on this CPU")

    def to_dict(self) -> dict:
        return {"hardware": self.hardware,
                "host": {"overhead_ms": self.host.overhead_ms, "gbps": self.host.gbps},
                "memmap": {"overhead_ms": self.memmap.overhead_ms, "gbps": self.memmap.gbps},
                "points": self.points}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TierMeasurement":
        try:
            lines = {k: MissPathLine(float(data[k]["overhead_ms"]), float(data[k]["gbps"])) for k in ("host", "memmap")}
            return cls(str(data["hardware"]), lines["host"], lines["memmap"], dict(data.get("points", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise NeuroShardError(f"a tier measurement needs 'hardware', 'host' and 'memmap' with 'overhead_ms' "
                                  f"and 'gbps': {exc!r}"[:300]) from None


def as_measurement(value: Any) -> "TierMeasurement | None":
    """``value`` as a ``TierMeasurement`` (None, a record, or its ``to_dict``)."""
    if value is None or isinstance(value, TierMeasurement):
        return value
    if isinstance(value, Mapping):
        return TierMeasurement.from_dict(value)
    raise NeuroShardError(f"measured tier costs must be a TierMeasurement or its dict, got {type(value).__name__}")


# ----------------------------------------------------------------- measure
def fit_line(bytes_moved: Sequence[float], ms: Sequence[float]) -> MissPathLine:
    """Least squares ``ms = a + b x bytes`` relative to each point's time (each residual over
    its ``ms``); ``a`` at least 0 (refitted through 0 when negative)."""
    x, y = np.asarray(bytes_moved, dtype=np.float64), np.asarray(ms, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0 or not (y > 0).all():
        raise NeuroShardError("fitting a miss-path line needs at least two sizes and positive times")
    w = 1.0 / y
    (a, b), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), y * w, rcond=None)
    if a < 0:  # the overhead is below the noise: a line through 0
        a, b = 0.0, float(np.sum(x * w * w * y) / np.sum((x * w) ** 2))
    if b <= 0:  # no growth measured (timer noise over tiny batches): the largest batch's bandwidth
        b = float(y[np.argmax(x)] / x.max())
    return MissPathLine(float(a), float(1.0 / b / 1e6))


def _store(memory: str, rows: int, width: int, folder: str) -> Any:
    """A filled backing store of ``rows x width`` fp32 (filled: the runtime's stores are)."""
    import torch
    values = torch.rand(rows, width, generator=torch.Generator().manual_seed(rows + width))
    if memory == "host":
        return values
    store = np.memmap(f"{folder}/rows-{width}.bin", dtype=np.float32, mode="w+", shape=(rows, width))
    store[:] = values.numpy()
    return store


def _time_batches(store: Any, rows: int, k: int, width: int, repeats: int, deadline: float,
                 rng: np.random.Generator) -> tuple[float, float]:
    """Median (milliseconds, rows moved) of a batch of ``k`` random rows brought into an
    ``LruRows`` cache of ``k`` slots on ``store``: every row a miss, ``k`` rows written back
    and ``k`` loaded (after two untimed batches that fill the cache; fewer past ``deadline``)."""
    import torch
    cache = LruRows(store, rows, width, k, torch.device("cpu"), torch.float32, rng)
    times: list[float] = []
    moved: list[int] = []
    for r in range(repeats + 2):
        _, n, seconds = cache.bring(np.sort(rng.choice(rows, k, replace=False)))
        if r >= 2:
            times.append(seconds)
            moved.append(n)
        if times and time.perf_counter() > deadline:
            break
    return 1e3 * float(np.median(times)), float(np.median(moved))


def measure_tier_costs(sizes: Sequence[tuple[int, int]] = TIER_SIZES, repeats: int = TIER_REPEATS,
                       budget_s: float = TIER_BUDGET_S, seed: int = 0) -> TierMeasurement:
    """Time the miss path (``write_back`` then ``load_rows``, as the runtime runs them: on one
    thread, as its CPU ranks do) for each ``(k, d)`` of ``sizes`` on a host-memory store and on
    a memory-mapped file in a temporary folder (removed after), and fit each store's line
    (module docstring)."""
    rng = np.random.default_rng(seed)
    points: dict[str, list[list[float]]] = {m: [] for m in BACKINGS}
    folder = tempfile.mkdtemp(prefix="neuroshard-tier-costs-")
    deadline = time.perf_counter() + budget_s
    try:
        with few_threads(1):
            for memory, width in ((m, d) for m in BACKINGS for d in sorted({d for _, d in sizes})):
                rows = max(STORE_BYTES // (width * ELEMENT_BYTES), 2 * max(k for k, _ in sizes))
                store = _store(memory, rows, width, folder)
                for k in sorted(k for k, d in sizes if d == width):
                    ms, moved = _time_batches(store, rows, k, width, repeats, deadline, rng)
                    points[memory].append([k, width, moved * width * ELEMENT_BYTES, ms])
                del store
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = {m: fit_line([p[2] for p in pts], [p[3] for p in pts]) for m, pts in points.items()}
    record = TierMeasurement(cpu_model(), lines["host"], lines["ssd"], points)
    log.info("tier costs %s", record.source)
    return record
