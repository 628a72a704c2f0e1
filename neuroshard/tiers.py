"""Memory tiers: where a table's rows live and what each tier holds.

A table (all of its shards: TorchRec runs one kernel per table) is in one of four states:

* **device**: every row in device memory (the default; a plan shard without ``memory``);
* **cached**: rows in host memory (``memory: "host"``) or on SSD (``"ssd"``), and a
  device cache holding ``cache_fraction`` of each shard's rows (fbgemm's
  ``fused_uvm_caching`` and ``key_value`` kernels);
* **host**: rows in host memory, no device cache (``fused_uvm``: every lookup crosses the
  host link);
* **ssd**: rows on the host's SSD, no device cache.

What each tier holds, in bytes (the one rule that plans, the search and ``plan validate``
use; ``optimizers.row_bytes`` is a row's weights plus optimizer state):

* device memory: a device shard's rows; a cached shard's ``ceil(f x rows)`` cached rows,
  each with its optimizer state and ``CACHE_ROW_OVERHEAD_BYTES`` of bookkeeping (a
  conservative reading of fbgemm's cache: its slot ids and LRU/LFU state; the optimizer
  state of a cached row is counted as cached with it);
* host memory or SSD: the whole shard, weights and optimizer state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .constants import CACHE_ROW_OVERHEAD_BYTES, MEMORY_TIERS
from .errors import FormatError
from .optimizers import DEFAULT_OPTIMIZER, row_bytes
from .validate import is_number

DEVICE = MEMORY_TIERS[0]


@dataclass(frozen=True)
class Tier:
    """Where a table's rows live (``memory``) and the share of them a device cache holds
    (``cache_fraction``; None: no cache, or every row on the device when ``memory`` is
    ``device``)."""

    memory: str = DEVICE
    cache_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.memory not in MEMORY_TIERS:
            raise FormatError(f"field 'memory' must be one of {', '.join(MEMORY_TIERS)}, got {self.memory!r}"[:300])
        if self.cache_fraction is not None:
            if self.memory == DEVICE:
                raise FormatError("a shard in device memory has no 'cache_fraction' (every row is on the device)")
            if not (is_number(self.cache_fraction) and 0.0 < self.cache_fraction <= 1.0):
                raise FormatError(f"'cache_fraction' must be a number in (0, 1], got {self.cache_fraction!r}")

    @property
    def on_device(self) -> bool:
        return self.memory == DEVICE

    @property
    def cached(self) -> bool:
        return self.cache_fraction is not None

    def label(self) -> str:
        """``device``, ``host``, ``ssd``, or ``host+cache 5%`` (``plan show``, the search's report)."""
        if self.cache_fraction is None:
            return self.memory
        return f"{self.memory}+cache {100 * self.cache_fraction:g}%"

    def to_dict(self) -> dict:
        """A plan shard's tier fields: none for device memory (such a plan reads as one without tiers)."""
        if self.on_device:
            return {}
        out: dict = {"memory": self.memory}
        if self.cache_fraction is not None:
            out["cache_fraction"] = self.cache_fraction
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> "Tier":
        try:
            return cls(data.get("memory", DEVICE), data.get("cache_fraction"))
        except FormatError as exc:
            raise FormatError(f"{where}: {exc}") from None

    # ---------------------------------------------------------------- bytes
    def cache_rows(self, num_rows: int) -> int:
        """Rows the device cache of a shard of ``num_rows`` rows holds (at least one)."""
        if self.cache_fraction is None:
            return 0
        return min(num_rows, max(1, math.ceil(self.cache_fraction * num_rows - 1e-9)))

    def device_row_bytes(self, num_cols: Any, bytes_per_element: int, optimizer: str = DEFAULT_OPTIMIZER) -> Any:
        """Device bytes per row of a shard ``num_cols`` wide, averaged over its rows (a cached
        shard's ``f x (row + bookkeeping)``): what a row split divides by."""
        full = row_bytes(num_cols, bytes_per_element, optimizer)
        if self.on_device:
            return full
        if self.cache_fraction is None:
            return 0 * full
        return self.cache_fraction * (full + CACHE_ROW_OVERHEAD_BYTES)

    def device_bytes(self, num_rows: int, num_cols: int, bytes_per_element: int,
                     optimizer: str = DEFAULT_OPTIMIZER) -> int:
        """Device memory of a shard of ``num_rows x num_cols`` in this tier."""
        full = row_bytes(num_cols, bytes_per_element, optimizer)
        if self.on_device:
            return num_rows * full
        return self.cache_rows(num_rows) * (full + CACHE_ROW_OVERHEAD_BYTES)

    def backing_bytes(self, num_rows: int, num_cols: int, bytes_per_element: int,
                      optimizer: str = DEFAULT_OPTIMIZER) -> int:
        """Host-memory or SSD bytes of such a shard (``memory`` says which; 0 in device memory)."""
        if self.on_device:
            return 0
        return num_rows * row_bytes(num_cols, bytes_per_element, optimizer)


#: every row in device memory: the tier of a table nothing else is said about
IN_DEVICE_MEMORY = Tier()


def device_bytes_array(tiers: "list[Tier] | None", tables: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                       bytes_per_element: int, optimizer: str = DEFAULT_OPTIMIZER) -> np.ndarray:
    """Device bytes of many pieces at once (``tables``, ``rows``, ``cols`` arrays of the same
    length; ``tiers`` per table index, None: all in device memory)."""
    full = rows * row_bytes(cols, bytes_per_element, optimizer)
    if tiers is None:
        return full.astype(np.float64)
    return np.array([tiers[t].device_bytes(int(r), int(c), bytes_per_element, optimizer)
                     for t, r, c in zip(tables.tolist(), rows.tolist(), cols.tolist())], dtype=np.float64)
