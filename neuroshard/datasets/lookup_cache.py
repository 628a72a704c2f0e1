"""Sampled lookups and the statistics drawn from them, cached by what they depend on.

A ``Table`` is a record (name, rows, width, pooling factor, access); sampling a batch
of its lookups is deterministic from those fields, the batch size and the seed, so the
samples are cached here under those keys, not inside the ``Table`` objects (equal
tables share them, and pickles of tables sent to worker processes carry none). The
cache is least-recently-used, bounded by bytes.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable, TypeVar

import numpy as np

#: most bytes of cached arrays kept (least recently used dropped first)
MAX_CACHE_BYTES = 1 << 30

T = TypeVar("T")
_entries: "OrderedDict[tuple, Any]" = OrderedDict()
_sizes: dict[tuple, int] = {}
_total = 0


def sampling_key(table: Any) -> tuple:
    """What a table's sampled lookups depend on: name (the default seed), rows, pooling
    factor, access distribution and the folder recorded indices are read from."""
    access = json.dumps(table.access, sort_keys=True, default=str)
    return (table.name, table.num_embeddings, float(table.pooling_factor), access, str(table.base_dir))


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 64


def cached(key: tuple, compute: Callable[[], T]) -> T:
    """``compute()``, once per ``key`` while it stays in the cache."""
    global _total
    if key in _entries:
        _entries.move_to_end(key)
        return _entries[key]
    value = compute()
    size = _nbytes(value)
    _entries[key], _sizes[key] = value, size
    _total += size
    while _total > MAX_CACHE_BYTES and len(_entries) > 1:
        old, _ = _entries.popitem(last=False)
        _total -= _sizes.pop(old)
    return value


def clear() -> None:
    """Drop every cached sample."""
    global _total
    _entries.clear()
    _sizes.clear()
    _total = 0
