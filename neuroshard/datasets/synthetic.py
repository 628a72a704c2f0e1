"""A synthetic benchmark of embedding tables calibrated to Meta's published
dlrm_datasets locality statistics (``neuroshard/data/dlrm_datasets_*_locality_stats.txt``).

Calibration targets, parsed from those files (never hard-coded):

- ``dlrm-2021``: 856 tables, batch 65536, the entry ``fbgemm_t856_bs65536.pt``.
- ``dlrm-2022``: 788 tables, batch 131072, the average of the ``fbgemm_t788_bs131072_*``
  entries (they differ by well under 1%).

Each entry gives, for one batch over all tables: the number of lookups ("Avg # of
indices"), distinct (table, row) pairs ("Avg # of unique cols"), lookups per distinct
row ("Avg col size"), the share of distinct rows per reuse bin ("Histogram of col
sizes", rounded to 3 decimals, so its tail reads 0.000) and the share of lookups per
reuse bin ("Ratio of index distribution").

How a table is drawn (all from one ``numpy`` generator seeded by ``seed``):

- ``pooling_factor``: lognormal (sigma 1), rescaled so that the mean over the tables
  equals the published lookups per table per sample (indices / tables / batch).
- skew: the table's share of lookups per reuse bin is ``g(b) * exp(s * (b - 8))`` with
  ``s ~ Normal(0, 0.3)`` (a few near-uniform tables, a few very hot ones), restricted
  to bins a table with that many lookups can reach. The common profile ``g`` is fitted
  (iterative proportional fitting) so that the lookup-weighted mix over all tables is
  the published "Ratio of index distribution". The table's distinct-row histogram and
  ``mean_reuse`` follow with ``access.distinct_from_lookup_share``, so the aggregate
  distinct-row histogram is the one consistent with the published lookup ratio (the
  rounded published histogram is only used to measure the result).
- ``num_embeddings``: the distinct rows one batch touches times a coverage factor
  ``1.2 + LogNormal(log 2, 1)`` (at least 100 rows), so hot tables, which touch few
  distinct rows, are small.
- ``embedding_dim``: 16, 32, 64 or 128 with probabilities 0.2, 0.3, 0.35, 0.15.

``calibration_report`` samples real lookups for one batch and compares the aggregate
with the published statistics.
"""
from __future__ import annotations

import logging
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import NeuroShardError
from ..tables import Table, TableSet
from ..validate import MAX_POOLING_FACTOR, read_text
from . import access as acc
from .sampler import lookups_from

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DIMS = (16, 32, 64, 128)
DIM_PROBS = (0.2, 0.3, 0.35, 0.15)
POOLING_SIGMA = 1.0
SKEW_SIGMA = 0.3
_SKEW_CENTER = 8


@dataclass(frozen=True)
class LocalityStats:
    """One entry of a dlrm_datasets locality statistics file (all tables, one batch)."""

    name: str
    batch_size: int
    num_indices: float
    num_unique: float
    mean_reuse: float
    distinct_hist: np.ndarray
    lookup_share: np.ndarray


@dataclass(frozen=True)
class Preset:
    """A named synthetic benchmark: table count, batch size and its calibration entries."""

    name: str
    stats_file: str
    entry_pattern: str
    num_tables: int
    batch_size: int


PRESETS = {
    "dlrm-2021": Preset("dlrm-2021", "dlrm_datasets_2021_locality_stats.txt",
                        r"fbgemm_t856_bs65536\.pt", num_tables=856, batch_size=65536),
    "dlrm-2022": Preset("dlrm-2022", "dlrm_datasets_2022_locality_stats.txt",
                        r"fbgemm_t788_bs131072_\d+\.pt", num_tables=788, batch_size=131072),
}


def _field(block: str, label: str, source: str, entry: str) -> float:
    m = re.search(rf"^{re.escape(label)}:\s*([0-9.eE+-]+)\s*$", block, re.MULTILINE)
    if not m:
        raise NeuroShardError(f"{source}: entry '{entry}': field '{label}' is missing")
    return float(m.group(1))


def _bins(block: str, header: str, source: str, entry: str) -> np.ndarray:
    start = block.find(header)
    if start < 0:
        raise NeuroShardError(f"{source}: entry '{entry}': field '{header}' is missing")
    values = re.findall(r"^\(\d+(?:, *\d+\]|\+):\s*([0-9.]+)\s*$", block[start:], re.MULTILINE)
    if len(values) < acc.NUM_BINS:
        raise NeuroShardError(f"{source}: entry '{entry}': field '{header}' has {len(values)} bins, "
                              f"expected {acc.NUM_BINS}")
    return np.array([float(v) for v in values[:acc.NUM_BINS]])


def parse_locality_stats(path: str | Path) -> dict[str, LocalityStats]:
    """All entries of a dlrm_datasets locality statistics file, by entry name."""
    path = Path(path)
    text = read_text(path, "locality statistics file")  # bounded, UTF-8, one-line errors
    names = list(re.finditer(r"^(\S+\.pt)\s*$", text, re.MULTILINE))
    if not names:
        raise NeuroShardError(f"{path}: no entries found (expected lines naming a '.pt' file)")
    entries = {}
    for i, m in enumerate(names):
        end = names[i + 1].start() if i + 1 < len(names) else len(text)
        block, entry = text[m.end():end], m.group(1)
        batch = re.search(r"batches of size (\d+)", block)
        if not batch:
            raise NeuroShardError(f"{path}: entry '{entry}': batch size is missing")
        ratio_at = block.find("Ratio of index distribution")
        entries[entry] = LocalityStats(
            name=entry, batch_size=int(batch.group(1)),
            num_indices=_field(block, "Avg # of indices", str(path), entry),
            num_unique=_field(block, "Avg # of unique cols", str(path), entry),
            mean_reuse=_field(block, "Avg col size", str(path), entry),
            distinct_hist=_bins(block[:ratio_at] if ratio_at >= 0 else block, "Histogram of col sizes",
                                str(path), entry),
            lookup_share=_bins(block, "Ratio of index distribution", str(path), entry))
    return entries


def get_preset(preset: str | Preset) -> Preset:
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise NeuroShardError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[preset]


def preset_stats(preset: str | Preset) -> LocalityStats:
    """The calibration target of a preset: its entry, or the average of its entries."""
    preset = get_preset(preset)
    path = DATA_DIR / preset.stats_file
    chosen = [s for name, s in parse_locality_stats(path).items() if re.fullmatch(preset.entry_pattern, name)]
    if not chosen:
        raise NeuroShardError(f"{path}: no entry matches {preset.entry_pattern!r} (preset {preset.name})")
    mean = lambda attr: float(np.mean([getattr(s, attr) for s in chosen]))  # noqa: E731
    return LocalityStats(
        name=", ".join(s.name for s in chosen), batch_size=chosen[0].batch_size,
        num_indices=mean("num_indices"), num_unique=mean("num_unique"), mean_reuse=mean("mean_reuse"),
        distinct_hist=np.mean([s.distinct_hist for s in chosen], axis=0),
        lookup_share=np.mean([s.lookup_share for s in chosen], axis=0))


def _fit_lookup_shares(target: np.ndarray, lookups: np.ndarray, skews: np.ndarray,
                       iterations: int = 500) -> np.ndarray:
    """Per-table shares of lookups per bin, ``g(b) * exp(s_t (b - 8))`` on the bins a
    table can reach, with ``g`` fitted so the lookup-weighted mix equals ``target``."""
    bins = np.arange(acc.NUM_BINS)
    reachable = acc.BIN_MEANS[None, :] * 4 <= np.maximum(lookups[:, None], 1)
    reachable[:, 0] = True
    tilt = np.exp(np.clip(skews[:, None] * (bins[None, :] - _SKEW_CENTER), -50, 50)) * reachable
    weights = lookups / lookups.sum()
    g = target.copy()
    for _ in range(iterations):
        shares = tilt * g
        shares /= shares.sum(axis=1, keepdims=True)
        mix = weights @ shares
        if np.abs(mix - target).sum() < 1e-6:
            break
        g = np.where(mix > 0, g * target / np.maximum(mix, 1e-300), g)
    shares = tilt * g
    return shares / shares.sum(axis=1, keepdims=True)


def _sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def generate(preset: str | Preset, num_tables: int | None = None, seed: int = 0) -> TableSet:
    """Synthetic tables calibrated to a preset's published statistics; same seed, same tables."""
    preset = get_preset(preset)
    count = preset.num_tables if num_tables is None else int(num_tables)
    if count < 1:
        raise NeuroShardError(f"preset {preset.name}: num_tables must be >= 1, got {num_tables}")
    stats = preset_stats(preset)
    batch = preset.batch_size
    rng = np.random.default_rng(seed)

    per_sample = stats.num_indices / preset.num_tables / batch
    pooling = rng.lognormal(0.0, POOLING_SIGMA, count)
    # a draw in the far tail of many tables stays within what a tables file may hold
    pooling = np.round(np.minimum(pooling * per_sample / pooling.mean(), MAX_POOLING_FACTOR), 4)
    lookups = np.maximum(np.round(pooling * batch), 1.0)
    skews = rng.normal(0.0, SKEW_SIGMA, count)
    target = stats.lookup_share / stats.lookup_share.sum()
    shares = _fit_lookup_shares(target, lookups, skews)
    per_distinct = shares / acc.BIN_MEANS[None, :]
    mean_reuse = 1.0 / per_distinct.sum(axis=1)
    distinct_hist = per_distinct * mean_reuse[:, None]
    coverage = 1.2 + rng.lognormal(math.log(2.0), 1.0, count)
    rows = np.maximum(100, np.ceil(lookups / mean_reuse * coverage)).astype(np.int64)
    dims = rng.choice(DIMS, size=count, p=DIM_PROBS)

    width = len(str(count - 1))
    tables = [Table(f"t{i:0{width}d}", int(rows[i]), int(dims[i]), float(pooling[i]),
                    {"reuse_histogram": [_sig(x) for x in distinct_hist[i]],
                     "mean_reuse": _sig(max(1.0, mean_reuse[i]))})
              for i in range(count)]
    extra = {"synthetic": {"preset": preset.name, "seed": seed, "calibrated_to": stats.name}}
    log.info("generated %d tables for preset %s (seed %d)", count, preset.name, seed)
    return TableSet(f"{preset.name}-t{count}-s{seed}", tables, batch, extra)


def calibration_subsample(tables: TableSet, max_tables: int | None) -> list[tuple[Table, float]]:
    """Tables to sample for calibration, each with the number of tables it stands for.

    All tables (weight 1) when ``max_tables`` is None or large enough. Otherwise a
    systematic sample with probability proportional to lookups per batch, tables ordered
    by hotness (``mean_reuse``): tables heavier than one sampling step are taken for
    certain, each other pick stands for ``step / its lookups`` tables (Horvitz-Thompson
    weights). Lookups dominate both histograms, so this keeps a small sample faithful."""
    if max_tables is None or max_tables >= len(tables):
        return [(t, 1.0) for t in tables]
    if max_tables < 1:
        raise NeuroShardError(f"tables '{tables.name}': max_tables must be >= 1, got {max_tables}")
    hotness = np.array([float(t.access.get("mean_reuse", 1.0)) for t in tables])
    order = np.argsort(hotness, kind="stable")
    lookups = np.array([t.pooling_factor for t in tables])[order] * tables.batch_size
    certain = np.zeros(len(tables), dtype=bool)
    while True:
        left = max_tables - certain.sum()
        rest = lookups[~certain].sum()
        if left <= 0 or rest <= 0:
            break
        heavy = ~certain & (lookups * left >= rest)
        if not heavy.any():
            break
        certain |= heavy
    chosen = [(tables[int(order[i])], 1.0) for i in np.flatnonzero(certain)]
    left, rest = max_tables - len(chosen), lookups[~certain].sum()
    if left > 0 and rest > 0:
        candidates = np.flatnonzero(~certain)
        step = rest / left
        cumulative = np.cumsum(lookups[candidates])
        picks = np.searchsorted(cumulative, (np.arange(left) + 0.5) * step, side="right")
        for i in np.unique(np.minimum(picks, candidates.size - 1)):
            j = candidates[i]
            chosen.append((tables[int(order[j])], float(step / lookups[j])))
    return chosen


def calibration_report(tables: TableSet, seed: int = 0, max_tables: int | None = None,
                       preset: str | None = None) -> dict:
    """Sample one batch of real lookups and compare the aggregate over the tables with the
    preset's published statistics (preset taken from the file when not given).

    ``max_tables`` limits sampling to a weighted subsample (``calibration_subsample``)."""
    name = preset or tables.extra.get("synthetic", {}).get("preset")
    if name is None:
        raise NeuroShardError(f"tables '{tables.name}': no preset recorded; pass preset=")
    stats = preset_stats(name)
    chosen = calibration_subsample(tables, max_tables)
    distinct, lookups = np.zeros(acc.NUM_BINS), np.zeros(acc.NUM_BINS)
    for table, weight in chosen:
        rng = np.random.default_rng([seed, zlib.crc32(table.name.encode())])
        counts = acc.reuse_counts(lookups_from(table, tables.batch_size, rng)[0])  # uncached: hundreds of tables
        bins = acc.reuse_bin(counts)
        distinct += weight * np.bincount(bins, minlength=acc.NUM_BINS)
        lookups += weight * np.bincount(bins, weights=counts, minlength=acc.NUM_BINS)
    per_sample = lookups.sum() / len(tables) / tables.batch_size
    mean_reuse = lookups.sum() / max(distinct.sum(), 1e-12)
    target_per_sample = stats.num_indices / get_preset(name).num_tables / stats.batch_size
    l1 = lambda hist, target: float(np.abs(hist / max(hist.sum(), 1e-12) - target / target.sum()).sum())  # noqa: E731
    return {
        "preset": name,
        "tables_sampled": len(chosen),
        "distinct_hist_l1": l1(distinct, stats.distinct_hist),
        "lookup_share_l1": l1(lookups, stats.lookup_share),
        "lookups_per_table_rel_err": float(abs(per_sample - target_per_sample) / target_per_sample),
        "mean_reuse_rel_err": float(abs(mean_reuse - stats.mean_reuse) / stats.mean_reuse),
        "lookups_per_table_per_sample": float(per_sample),
        "mean_reuse": float(mean_reuse),
    }
