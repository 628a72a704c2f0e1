"""Miss rates of a device cache in front of a table held in host memory or on SSD.

A cache holds a fraction ``f`` of a table's rows (``C = f x rows``), filled by least
recently used (LRU) or least frequently used (LFU) eviction. Its **miss rate** is defined
as TorchRec's ``CacheStatistics`` define it: the share of a batch's unique row ids that
are not in the cache before the batch, at steady state, for batches of the tables file's
``batch_size`` (each batch looks up ``batch_size x pooling_factor`` rows; all of a batch's
rows enter the cache together, as fbgemm's TBE cache prefetches a batch).

Two ways to get it, one meaning:

* ``replay_miss_rates``: an exact replay of a stream of batches. LRU holds the ``C`` most
  recently used distinct rows; LFU (perfect LFU: counts from the stream's start) the ``C``
  most used. Where a tie at the cache's edge leaves room for part of a group of rows (the
  rows of one batch under LRU, rows of equal counts under LFU), each row of the group is in
  the cache with the same probability: the expected miss rate over the group's orders. The
  first half of the stream warms the cache; the rates are over the second half.
* ``predict_miss_rates``: from the table's access description, without a stream. Each
  row appears in a batch with a probability ``q`` (the batch's lookups drawn independently,
  as ``datasets.access`` draws them). LRU: Che's approximation at batch granularity: the
  cache holds the rows used in the last ``k`` batches, and a share ``phi`` of the rows last
  used ``k + 1`` batches ago (the replay's even split at the edge), ``k`` and ``phi`` filling
  ``C`` rows in expectation; a row present in a batch was cached with probability
  ``1 - (1 - q)^k + phi (1 - q)^k q``. LFU: at steady state (counts over a long history)
  the cache holds the ``C`` rows of highest ``q``; after ``history`` batches, a row's count
  is Poisson and the cache holds the rows counted most (``_lfu_hit``).

What the description gives decides the ``q``s: ``zipf_alpha``: the power law of
``access._zipf_ranks``, exact per rank for the hottest ranks, then in rank bins of 1%
relative width; ``reuse_histogram``: the sampler re-draws the same ``D = lookups / mean
reuse`` hottest rows every batch (the histogram describes reuse within a batch), so
those ``D`` rows appear in every batch; no access: uniform. Recorded lookups
(``access.indices``) are **replayed** in their recorded order, cut into consecutive
batches, when the recording holds at least ``MIN_RECORDED_BATCHES`` batches of the
tables' batch size; a shorter recording's row frequencies drive the prediction instead.

No library computes these for arbitrary access descriptions on CPU (TorchRec's
``CacheStatistics`` reads miss-ratio curves it is given; fbgemm measures its own cache at
run time), hence this module. ``experiments/cache_model.py`` measures the prediction
against replays of long streams, including streams whose hot set drifts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..constants import CACHE_ALGORITHMS
from ..errors import NeuroShardError
from ..tables import Table
from . import access as acc
from .dlrm import check_recorded_rows, recorded_lookups
from .sampler import draw_lookups, lookups_from

#: ranks below this are costed one by one; the rest in bins of ``RANK_BIN_RATIO`` relative width
EXACT_RANKS = 4096
RANK_BIN_RATIO = 1.01
#: a recording shorter than this many batches of the tables' batch size is not replayed
MIN_RECORDED_BATCHES = 4


@dataclass
class CacheCurve:
    """A table's miss rate per cache fraction, with how it was obtained."""

    table: str
    batch_size: int
    algorithm: str
    unique_per_batch: float
    miss_rate: dict[float, float] = field(default_factory=dict)
    method: str = "predicted"  # "predicted" (from the access description) or "replayed" (a recorded stream)


def check_fractions(fractions: Iterable[float]) -> list[float]:
    """Cache fractions in (0, 1], in the order given; NeuroShardError otherwise."""
    out = []
    for f in fractions:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (0 < f <= 1) or not math.isfinite(f):
            raise NeuroShardError(f"a cache fraction must be a number in (0, 1], got {f!r}")
        out.append(float(f))
    if not out:
        raise NeuroShardError("give at least one cache fraction")
    return out


def check_algorithm(algorithm: str) -> str:
    if algorithm not in CACHE_ALGORITHMS:
        raise NeuroShardError(f"cache algorithm must be one of {', '.join(CACHE_ALGORITHMS)}, got {algorithm!r}")
    return algorithm


# ------------------------------------------------------------------ presence
def presence(table: Table, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, count, per_batch)``: rows fall in classes of ``count[k]`` rows, each appearing in
    a batch with probability ``q[k]`` and looked up ``per_batch[k]`` times per batch on
    average (classes in decreasing ``q``); rows never looked up are left out."""
    lookups = int(round(batch_size * table.pooling_factor))
    rows = table.num_embeddings
    access = table.access or {}
    if lookups <= 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    if "indices" in access:
        ids = draw_lookups(table, batch_size)[0]
        counts = np.bincount(np.unique(ids, return_counts=True)[1])
        share = np.flatnonzero(counts)  # rows seen c times: lookup probability c / total
        p = share / ids.size
        return _sorted(_present(p, lookups), counts[share].astype(np.float64), p * lookups)
    if "reuse_histogram" in access:
        hist = np.asarray(access["reuse_histogram"], dtype=np.float64)
        hist = hist / hist.sum() if hist.sum() > 0 else np.eye(acc.NUM_BINS)[0]
        _, mean = acc.lookup_share_from_distinct(hist)
        distinct = int(min(rows, max(1, round(lookups / mean))))
        return np.ones(1), np.array([float(distinct)]), np.array([lookups / distinct])
    if "zipf_alpha" in access and float(access["zipf_alpha"]) > 0:
        p, count = _zipf_classes(float(access["zipf_alpha"]), rows)
        return _sorted(_present(p, lookups), count, p * lookups)
    return _present(np.array([1.0 / rows]), lookups), np.array([float(rows)]), np.array([lookups / rows])


def _present(p: np.ndarray, lookups: int) -> np.ndarray:
    """Probability that a row looked up with probability ``p`` per lookup is in a batch of
    ``lookups`` independent lookups: ``1 - (1 - p)^lookups``, computed stably."""
    return -np.expm1(lookups * np.log1p(-np.minimum(p, 1 - 1e-15)))


def _sorted(q: np.ndarray, count: np.ndarray, per_batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(-q, kind="stable")
    return q[order], count[order], per_batch[order]


def _zipf_classes(alpha: float, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-lookup probability of each rank class under ``access._zipf_ranks`` (rank ``k`` is
    ``floor(x) - 1`` for ``x`` drawn with density ``~ x^-alpha`` on ``[1, rows + 1]``)."""
    def cdf(x: np.ndarray) -> np.ndarray:
        if abs(alpha - 1.0) < 1e-6:
            return np.log(x)
        return (np.power(x, 1.0 - alpha) - 1.0) / (1.0 - alpha)

    exact = min(rows, EXACT_RANKS)
    edges = [np.arange(exact + 1, dtype=np.float64)]
    if rows > exact:
        grown = np.unique(np.ceil(exact * RANK_BIN_RATIO ** np.arange(1, math.ceil(
            math.log(rows / exact) / math.log(RANK_BIN_RATIO)) + 2)))
        edges.append(np.minimum(grown, rows))
    edges = np.unique(np.concatenate(edges))  # rank boundaries: class k holds ranks [edges[k], edges[k+1])
    mass = np.diff(cdf(edges + 1.0)) / (cdf(np.array([rows + 1.0]))[0] - cdf(np.array([1.0]))[0])
    count = np.diff(edges)
    return mass / count, count


# ------------------------------------------------------------------ prediction
def predict_miss_rates(table: Table, batch_size: int, fractions: Sequence[float],
                       algorithm: str = "lru", history: int | None = None) -> CacheCurve:
    """The miss rate of a cache of each fraction of ``table``'s rows (see the module
    docstring): predicted from its access description, or replayed from its recording.
    ``history``: LFU's counts cover this many batches (None: a long run, steady state;
    a replay's second half has ``0.75 x`` its batches on average)."""
    fractions, algorithm = check_fractions(fractions), check_algorithm(algorithm)
    stream = recorded_stream(table, batch_size)
    if stream is not None:
        unique, rates = replay_miss_rates(stream, table.num_embeddings, fractions, algorithm)
        return CacheCurve(table.name, batch_size, algorithm, unique, dict(zip(fractions, rates)), "replayed")
    q, count, per_batch = presence(table, batch_size)
    unique = float((q * count).sum())
    rates = [_predict(q, count, per_batch, f * table.num_embeddings, algorithm, history) for f in fractions]
    return CacheCurve(table.name, batch_size, algorithm, unique, dict(zip(fractions, rates)))


def _predict(q: np.ndarray, count: np.ndarray, per_batch: np.ndarray, capacity: float, algorithm: str,
             history: int | None) -> float:
    unique = float((q * count).sum())
    if unique <= 0 or capacity >= count.sum():
        return 0.0
    if algorithm == "lfu":
        if history is None or np.all(q >= 1.0):  # steady state: the capacity's most likely rows
            held = np.clip(capacity - (np.cumsum(count) - count), 0.0, count)
            return float((q * (count - held)).sum() / unique)
        return float((count * q * (1.0 - _lfu_hit(count, per_batch * history, capacity))).sum() / unique)
    # LRU holds the rows used in the last k batches and a share phi of those last used k+1
    # batches ago (the replay's even split of a batch at the cache's edge)
    log_miss = np.log1p(-np.minimum(q, 1 - 1e-15))

    def cached_rows(k: int) -> float:  # distinct rows used in the last k batches
        return float((count * -np.expm1(k * log_miss)).sum())

    low, high = 0, 1
    while cached_rows(high) <= capacity and high < 2**50:
        low, high = high, high * 2
    while high - low > 1:  # the last k whose rows all fit
        mid = (low + high) // 2
        low, high = (mid, high) if cached_rows(mid) <= capacity else (low, mid)
    k = low
    older = np.exp(k * log_miss)  # a row not used in the last k batches
    edge = float((count * older * q).sum())  # rows last used exactly k+1 batches ago
    phi = min(1.0, max(0.0, (capacity - cached_rows(k)) / edge)) if edge > 0 else 0.0
    hit = -np.expm1(k * log_miss) + phi * older * q
    return float((count * q * (1.0 - hit)).sum() / unique)


def _lfu_hit(count: np.ndarray, mean: np.ndarray, capacity: float) -> np.ndarray:
    """Per class, the chance a row is cached by an LFU cache after a finite history: its
    lookup count is Poisson with ``mean``; the cache holds the rows counted ``m + 1`` times
    or more and a share of those counted exactly ``m`` (the replay's tie rule), ``m >= 1``
    chosen so that ``capacity`` rows are held in expectation."""
    from scipy.special import gammainc  # P(X >= m) of a Poisson X is the regularized gamma P(m, mean)

    def at_least(m: int) -> np.ndarray:
        return gammainc(m, mean) if m >= 1 else np.ones_like(mean)

    def held(m: int) -> float:
        return float((count * at_least(m)).sum())

    if held(1) <= capacity:  # every row seen so far fits
        return at_least(1)
    low, high = 1, 2  # held(low) > capacity >= held(high)
    while held(high) > capacity:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if held(mid) > capacity else (low, mid)
    m = low  # rows counted >= m + 1 (= high) fit; those counted exactly m share the rest
    above, edge = at_least(m + 1), at_least(m) - at_least(m + 1)
    spare = (capacity - float((count * above).sum())) / max(float((count * edge).sum()), 1e-300)
    return above + min(1.0, max(0.0, spare)) * edge


# ------------------------------------------------------------------ replay
def recorded_stream(table: Table, batch_size: int) -> list[np.ndarray] | None:
    """The recorded lookups of ``table`` cut into consecutive batches of ``batch_size``
    samples, or None when it has none or they hold fewer than ``MIN_RECORDED_BATCHES``."""
    if "indices" not in (table.access or {}):
        return None
    recorded, t, path = recorded_lookups(table)
    batches = recorded.batch_size // batch_size
    if batches < MIN_RECORDED_BATCHES:
        return None
    rows = check_recorded_rows(table, recorded.table_indices(t).astype(np.int64), path)
    lengths = recorded.lengths[t].astype(np.int64)
    ends = np.cumsum(lengths)[batch_size - 1::batch_size][:batches]
    return np.split(rows[:int(ends[-1])], ends[:-1])


def draw_stream(table: Table, batch_size: int, batches: int, seed: int = 0) -> list[np.ndarray]:
    """``batches`` batches of ``table``'s lookups drawn from its description (the sampler's,
    a fresh seed per batch)."""
    rng = np.random.default_rng(seed)
    return [lookups_from(table, batch_size, rng)[0] for _ in range(batches)]


def replay_miss_rates(stream: Sequence[np.ndarray], num_rows: int, fractions: Sequence[float],
                      algorithm: str = "lru") -> tuple[float, list[float]]:
    """``(unique ids per batch, miss rate per fraction)`` of an exact replay of ``stream``
    (batches of row ids; see the module docstring), over its second half."""
    fractions, algorithm = check_fractions(fractions), check_algorithm(algorithm)
    if len(stream) < 2:
        raise NeuroShardError(f"a replay needs at least 2 batches (the first half warms the cache), got {len(stream)}")
    capacities = np.array([f * num_rows for f in fractions])
    warm = len(stream) // 2
    misses, uniques = np.zeros(len(fractions)), 0.0
    if algorithm == "lru":
        last = np.full(num_rows, -1, dtype=np.int64)
        per_batch = np.zeros(len(stream) + 1)  # rows whose last use is each batch
        for b, batch in enumerate(stream):
            ids = np.unique(batch)
            seen = last[ids]
            if b >= warm:
                newer = np.cumsum(per_batch[:b][::-1])[::-1]  # newer[t]: rows last used at batch t or later
                later = np.append(newer[1:], 0.0)  # ... strictly after t
                old = seen >= 0
                t = seen[old]
                for k, capacity in enumerate(capacities):
                    room = np.clip(capacity - later[t], 0.0, per_batch[t])
                    misses[k] += ids.size - float((room / per_batch[t]).sum())
                uniques += ids.size
            np.subtract.at(per_batch, seen[seen >= 0], 1.0)
            last[ids] = b
            per_batch[b] += ids.size
    else:
        counts = np.zeros(num_rows)
        for b, batch in enumerate(stream):
            ids, times = np.unique(batch, return_counts=True)
            if b >= warm:
                ordered = np.sort(counts[counts > 0])[::-1]
                mine = counts[ids]
                for k, capacity in enumerate(capacities):
                    if capacity >= ordered.size:  # every row used so far fits
                        cached = (mine > 0).astype(np.float64)
                    else:  # the capacity's most used rows; rows tied at the edge share what is left
                        edge = ordered[max(1, math.ceil(capacity)) - 1]
                        above, at_edge = float((ordered > edge).sum()), float((ordered == edge).sum())
                        share = min(1.0, max(0.0, (capacity - above) / at_edge))
                        cached = (mine > edge) + (mine == edge) * share
                    misses[k] += ids.size - float(cached.sum())
                uniques += ids.size
            counts[ids] += times
    batches = len(stream) - warm
    return uniques / batches, (misses / max(uniques, 1.0)).tolist()


__all__ = ["CacheCurve", "predict_miss_rates", "replay_miss_rates", "draw_stream", "recorded_stream", "presence",
           "check_fractions", "check_algorithm"]
