"""The feature vector of a shard, named and versioned in one place.

A shard is described as a table of its own (``datasets.sampler.shard_table``): its rows, its width,
its lookups per sample and its reuse histogram as that shard sees them. Cost
models store ``FEATURE_SCHEMA_VERSION`` and ``FEATURE_NAMES`` with their
checkpoints and refuse another version.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..access_spec import NUM_BINS
from ..constants import FP32_BYTES
from ..datasets.sampler import reuse_histograms
from ..tables import Table

FEATURE_SCHEMA_VERSION = 1
FEATURE_NAMES: tuple[str, ...] = (
    "dim",               # columns of the shard
    "log2_rows",         # log2 of rows held
    "pooling_factor",    # lookups per sample landing in the shard
    "log2_size_bytes",   # log2 of rows x dim x 4
    "log2_mean_reuse",   # log2 of lookups per distinct row in one batch
) + tuple(f"lookup_share_bin{b}" for b in range(NUM_BINS))  # share of lookups per reuse bin
NUM_FEATURES = len(FEATURE_NAMES)


def table_features(table: Table, batch_size: int) -> np.ndarray:
    """The feature vector (float32, ``NUM_FEATURES``) of one shard or table."""
    _, lookup_share, mean_reuse = reuse_histograms(table, batch_size)
    head = [float(table.embedding_dim), float(np.log2(table.num_embeddings)), float(table.pooling_factor),
            float(np.log2(table.size_bytes(FP32_BYTES))), float(np.log2(max(mean_reuse, 1.0)))]
    return np.concatenate([head, lookup_share]).astype(np.float32)


def shard_set_features(tables: Sequence[Table], batch_size: int) -> np.ndarray:
    """Features of a set of shards run as one fused kernel: shape (len(tables), NUM_FEATURES)."""
    if not tables:
        return np.zeros((0, NUM_FEATURES), dtype=np.float32)
    return np.stack([table_features(t, batch_size) for t in tables])


def capped_weight_bytes(shards: np.ndarray, row_cap: int) -> float:
    """The fp32 weight bytes of one set's shard features (``shard_set_features``'s rows), each
    shard's rows capped at ``row_cap`` as a measured shard allocates them (``constants.DEFAULT_MAX_ROWS``)."""
    s = np.asarray(shards, dtype=np.float64).reshape(len(shards), -1)
    rows = np.minimum(np.exp2(s[:, FEATURE_NAMES.index("log2_rows")]), row_cap)
    return float((rows * s[:, FEATURE_NAMES.index("dim")] * FP32_BYTES).sum())
