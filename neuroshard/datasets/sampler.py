"""Sampling a table's lookups and the statistics drawn from them.

A ``Table`` is a record; what its lookups look like in a batch is computed here:
a batch of lookups (deterministic for a seed; the default seed is derived from
the table's name), its reuse histograms, the part of the table a row-wise shard
holds as a table of its own, and a per-table summary. Results used more than once
are cached in ``lookup_cache`` under what they depend on.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

from ..constants import FP32_BYTES
from ..tables import Table, TableSet
from . import access as acc
from .dlrm import recorded_batch
from .lookup_cache import cached, sampling_key

if TYPE_CHECKING:
    import pandas as pd


def default_seed(table: Table) -> int:
    """The seed of a table's lookups when none is given: from its name."""
    return zlib.crc32(table.name.encode())


def lookups_from(table: Table, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One batch of lookups drawn with ``rng``: (row ids, lengths per sample)."""
    if "indices" in table.access:
        return recorded_batch(table, batch_size, rng)
    num = int(round(batch_size * table.pooling_factor))
    rows = acc.sample_rows(table.access, table.num_embeddings, num, rng)
    return rows, acc.lengths_for(num, batch_size, rng)


def draw_lookups(table: Table, batch_size: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``sample_lookups`` without the cache (a training step's batch, used once)."""
    return lookups_from(table, batch_size, np.random.default_rng(default_seed(table) if seed is None else seed))


def sample_lookups(table: Table, batch_size: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One batch of lookups: (row ids, lengths per sample), deterministic for a seed
    (default: ``default_seed``); cached."""
    return cached((*sampling_key(table), "batch", batch_size, seed), lambda: draw_lookups(table, batch_size, seed))


def reuse_histograms(table: Table, batch_size: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(share of distinct rows per reuse bin, share of lookups per bin, mean reuse) in
    one batch: from the file's histogram when given, else from a sampled batch."""
    def compute() -> tuple[np.ndarray, np.ndarray, float]:
        if "reuse_histogram" in table.access:
            distinct = np.asarray(table.access["reuse_histogram"], dtype=np.float64)
            distinct = distinct / distinct.sum()
            lookups, implied = acc.lookup_share_from_distinct(distinct)
            return distinct, lookups, float(table.access.get("mean_reuse", implied))
        return acc.reuse_histograms(sample_lookups(table, batch_size)[0])
    return cached((*sampling_key(table), "hist", batch_size), compute)


def shard_table(table: Table, row_offset: int, num_rows: int, col_offset: int, num_cols: int,
                batch_size: int) -> Table:
    """The part of ``table`` a shard holds, as a table of its own (rows, width, lookups
    per sample and reuse as that shard sees them in a batch of ``batch_size``)."""
    name = table.name if (num_rows, num_cols) == (table.num_embeddings, table.embedding_dim) \
        else f"{table.name}[{row_offset}:{row_offset + num_rows},{col_offset}:{col_offset + num_cols}]"
    if num_rows == table.num_embeddings:
        return Table(name, num_rows, num_cols, table.pooling_factor, dict(table.access), base_dir=table.base_dir)

    def compute() -> tuple[float, np.ndarray, float]:
        rows = sample_lookups(table, batch_size)[0]
        inside = rows[(rows >= row_offset) & (rows < row_offset + num_rows)]
        distinct, _, mean_reuse = acc.reuse_histograms(inside)
        if inside.size == 0:
            distinct[0] = 1.0
            mean_reuse = 1.0
        return inside.size / batch_size, distinct, mean_reuse
    pooling, distinct, mean_reuse = cached((*sampling_key(table), "rows", batch_size, row_offset, num_rows), compute)
    access = {"reuse_histogram": [round(float(x), 6) for x in distinct], "mean_reuse": mean_reuse}
    return Table(name, num_rows, num_cols, float(pooling), access)


def summary(tables: TableSet, bytes_per_element: int = FP32_BYTES) -> "pd.DataFrame":
    """One row per table: rows, width, pooling factor, size, mean reuse, share of lookups
    on rows reused more than ``access.HOT_REUSE`` (32) times in a batch (skew)."""
    import pandas as pd
    rows = []
    for t in tables:
        _, lookup_share, mean_reuse = reuse_histograms(t, tables.batch_size)
        rows.append({"table": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
                     "pooling_factor": t.pooling_factor, "size_bytes": t.size_bytes(bytes_per_element),
                     "mean_reuse": mean_reuse, "hot_lookup_share": float(lookup_share[acc.HOT_FIRST_BIN:].sum())})
    return pd.DataFrame(rows)
