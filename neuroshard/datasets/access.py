"""How lookups spread over a table's rows: sampling lookups and measuring reuse.

An access distribution is the ``access`` object of the tables format:
uniform (empty), ``zipf_alpha``, a 17-bin ``reuse_histogram`` (+ ``mean_reuse``),
or recorded ``indices``. ``row_order`` maps popularity ranks to row ids.

Reuse bins follow the dlrm_datasets locality statistics: a distinct row looked
up ``c`` times in one batch falls in bin ``ceil(log2(c))`` (bins (0,1], (1,2],
(2,4], ... (16384,32768], (32768, inf)).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..access_spec import NUM_BINS

#: lower edges of the reuse bins: bin b holds counts in (BIN_EDGES[b], BIN_EDGES[b+1]]
BIN_EDGES = [0] + [2**i for i in range(NUM_BINS - 1)]
BIN_LABELS = [f"({lo}, {hi}]" for lo, hi in zip(BIN_EDGES[:-1], BIN_EDGES[1:])] + [f"({BIN_EDGES[-1]}, inf)"]

# A prime used to scatter popularity ranks over row ids (a fixed bijection of Z_N).
_SCATTER_PRIME = 2_654_435_761


def reuse_bin(counts: np.ndarray) -> np.ndarray:
    """Bin index of each reuse count (counts >= 1)."""
    counts = np.asarray(counts, dtype=np.float64)
    return np.clip(np.ceil(np.log2(np.maximum(counts, 1.0))), 0, NUM_BINS - 1).astype(np.int64)


def histograms_from_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """From per-distinct-row reuse counts: (share of distinct rows per bin,
    share of lookups per bin, mean lookups per distinct row)."""
    counts = np.asarray(counts, dtype=np.float64)
    counts = counts[counts > 0]
    if counts.size == 0:
        return np.zeros(NUM_BINS), np.zeros(NUM_BINS), 0.0
    bins = reuse_bin(counts)
    distinct = np.bincount(bins, minlength=NUM_BINS).astype(np.float64)
    lookups = np.bincount(bins, weights=counts, minlength=NUM_BINS)
    return distinct / distinct.sum(), lookups / lookups.sum(), float(counts.mean())


def reuse_counts(row_ids: np.ndarray) -> np.ndarray:
    """Lookups per distinct row in a batch of row ids."""
    row_ids = np.asarray(row_ids)
    if row_ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(row_ids, return_counts=True)[1]


def reuse_histograms(row_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(distinct-row histogram, lookup histogram, mean reuse) of a batch of row ids."""
    return histograms_from_counts(reuse_counts(row_ids))


def bin_count_support(b: int) -> np.ndarray:
    """The integer reuse counts of bin ``b`` (the open last bin is capped at 2x its edge)."""
    lo = BIN_EDGES[b]
    hi = BIN_EDGES[b + 1] if b + 1 < NUM_BINS else 2 * BIN_EDGES[-1]
    return np.arange(lo + 1, hi + 1)


def bin_mean_counts() -> np.ndarray:
    """Mean count within each bin when counts are log-uniform inside it."""
    means = np.empty(NUM_BINS)
    for b in range(NUM_BINS):
        support = bin_count_support(b).astype(np.float64)
        weights = 1.0 / support
        means[b] = (support * weights).sum() / weights.sum()
    return means


#: mean reuse count within each bin (``bin_mean_counts``)
BIN_MEANS = bin_mean_counts()
#: rows reused more than this many times in a batch are "hot" (``TableSet.summary``'s hot_lookup_share)
HOT_REUSE = 32
HOT_FIRST_BIN = BIN_EDGES.index(HOT_REUSE)  # the first bin of counts above HOT_REUSE


def lookup_share_from_distinct(distinct_hist: np.ndarray) -> tuple[np.ndarray, float]:
    """Share of lookups per bin and mean reuse implied by a distinct-row histogram."""
    h = np.asarray(distinct_hist, dtype=np.float64)
    h = h / h.sum()
    weighted = h * BIN_MEANS
    return weighted / weighted.sum(), float(weighted.sum())


def distinct_from_lookup_share(lookup_hist: np.ndarray) -> tuple[np.ndarray, float]:
    """Distinct-row histogram and mean reuse implied by a share-of-lookups histogram."""
    r = np.asarray(lookup_hist, dtype=np.float64)
    r = r / r.sum()
    per_distinct = r / BIN_MEANS
    return per_distinct / per_distinct.sum(), float(1.0 / per_distinct.sum())


def _scatter(ranks: np.ndarray, num_rows: int) -> np.ndarray:
    """Fixed pseudo-random bijection from ranks to row ids in [0, num_rows)."""
    prime = _SCATTER_PRIME
    while math.gcd(prime, num_rows) != 1:
        prime += 2
    return (ranks.astype(np.int64) * (prime % num_rows) + num_rows // 3) % num_rows if num_rows > 1 else ranks * 0


def _zipf_ranks(alpha: float, num_rows: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Popularity ranks (0 = hottest) from a power law with exponent ``alpha`` over num_rows ranks."""
    u = rng.random(size)
    n1 = float(num_rows) + 1.0
    if abs(alpha - 1.0) < 1e-6:
        x = np.exp(u * math.log(n1))
    elif alpha <= 0:
        x = 1.0 + u * (n1 - 1.0)
    else:
        e = 1.0 - alpha
        x = (1.0 + u * (n1**e - 1.0)) ** (1.0 / e)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, num_rows - 1)


def _histogram_rows(access: Mapping, num_rows: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Lookups whose per-row reuse counts follow a 17-bin distinct-row histogram.

    Returns popularity ranks (0 = hottest)."""
    hist = np.asarray(access["reuse_histogram"], dtype=np.float64)
    if hist.sum() <= 0:
        hist = np.zeros(NUM_BINS)
        hist[0] = 1.0
    hist = hist / hist.sum()
    _, implied_mean = lookup_share_from_distinct(hist)
    distinct = int(min(num_rows, max(1, round(size / implied_mean))))
    bins = rng.choice(NUM_BINS, size=distinct, p=hist)
    counts = np.ones(distinct, dtype=np.int64)
    for b in np.unique(bins):
        if b == 0:
            continue
        support = bin_count_support(int(b))
        weights = 1.0 / support
        mask = bins == b
        counts[mask] = rng.choice(support, size=int(mask.sum()), p=weights / weights.sum())
    order = np.argsort(-counts, kind="stable")  # rank 0 = the most reused row
    counts = counts[order]
    ranks = np.repeat(np.arange(distinct, dtype=np.int64), counts)
    total = ranks.size
    if total > size:
        ranks = rng.choice(ranks, size=size, replace=False)
    elif total < size:  # too few distinct rows available: reuse the same rows more
        extra = rng.choice(distinct, size=size - total, p=counts / counts.sum())
        ranks = np.concatenate([ranks, extra])
    return ranks


def sample_rows(access: Mapping | None, num_rows: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` row ids in [0, num_rows) drawn from an access distribution (not recorded indices)."""
    access = access or {}
    size = int(size)
    if size <= 0:
        return np.zeros(0, dtype=np.int64)
    if "reuse_histogram" in access:
        ranks = _histogram_rows(access, num_rows, size, rng)
    elif "zipf_alpha" in access:
        ranks = _zipf_ranks(float(access["zipf_alpha"]), num_rows, size, rng)
    else:
        return rng.integers(0, num_rows, size=size, dtype=np.int64)
    if access.get("row_order", "scattered") == "hottest_first":
        rows = ranks
    else:
        rows = _scatter(ranks, num_rows)
    rng.shuffle(rows)
    return rows.astype(np.int64)


def lengths_for(num_lookups: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Lookups per sample: each lookup goes to a uniformly random sample of the batch."""
    owners = rng.integers(0, batch_size, size=int(num_lookups))
    return np.bincount(owners, minlength=batch_size).astype(np.int64)
