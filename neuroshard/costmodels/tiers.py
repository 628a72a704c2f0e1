"""What a table's memory tier adds to its device's time: an analytic model of the traffic.

A shard whose rows live in host memory or on SSD (``neuroshard.tiers``) runs its kernel
on the device's cache, which the compute model costs as for a device shard; what the
tier adds per iteration (ms at the tables' batch), for ``U`` unique rows the batch looks
up in the shard (``datasets.cache_model``: the table's unique ids per batch, times the
shard's share of the rows), ``m(f)`` the miss rate of a cache of a fraction ``f`` of
its rows (LRU, the table's own locality), and a row of ``R`` bytes (weights and
optimizer state):

* **cached in host memory** (fbgemm ``fused_uvm_caching``): ``m x U`` rows loaded over
  the host link and as many evicted rows written back (every looked-up row was updated,
  so an evicted row is dirty): ``2 m U R / host_link``;
* **host memory, no cache** (``fused_uvm``): the kernel reads every lookup's weights over
  the link (``lookups x dim x bytes_per_element``) and the update reads and writes the
  ``U`` rows: ``(lookups x row weights + 2 U R) / host_link``;
* **SSD** (fbgemm ``key_value``; without a cache ``m = 1``): the host-link traffic of a
  cached shard plus the SSD's reads and writes of ``m U`` rows, each at least
  ``SSD_READ_BYTES``, by bandwidth or by IOPS, whichever is slower, the drive shared by
  the host's devices: ``2 m U max(R, SSD_READ_BYTES) / (ssd_gbps / L)`` or
  ``2 m U / (ssd_iops / L)``.

The figures are the topology's (``Topology.tier_links``: stated, or the documented
defaults of a common GPU server); this model is **analytic** by default, never measured here:
this machine has no GPU host link and no SSD under a GPU. What this machine can measure is
the included runtime's miss path on CPU (host-memory and memory-mapped-file backing stores,
``samples.tiers``): given such a measurement (``measured=``), a shard's miss path is costed
as the runtime runs it, ``2 m U R`` bytes (``m = 1`` without a cache: every row the batch
looks up is loaded and written back) over the measured line of its store, host memory for
``host``, the memory-mapped file for ``ssd``: ``overhead + 2 m U R / gbps`` (the overhead
once per batch, scaled down when fewer than one row is expected to move). Such costs are
for plans the included runtime trains on this machine's CPUs; ``neuroshard evaluate`` reports
the miss path it times. Prefetching that overlaps the next batch's
misses with this batch's compute (fbgemm's pipelined prefetch) is not credited: the
estimate is the serial cost, an upper bound.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..constants import CACHE_FRACTIONS, SSD_READ_BYTES
from ..datasets.cache_model import predict_miss_rates
from ..optimizers import DEFAULT_OPTIMIZER, row_bytes
from ..tables import Table
from ..tiers import Tier
from ..topology import Topology, ranks_per_host
from .samples.tiers import TierMeasurement, as_measurement

#: how the tier costs are obtained, for the plan's provenance
TIER_COST_SOURCE = "analytic (topology figures: host link, SSD bandwidth and IOPS; not measured)"


class TierCostModel:
    """Milliseconds a tier adds to a shard, at the tables' batch (see the module docstring).

    Miss-rate curves come from ``datasets.cache_model.predict_miss_rates`` (LRU) at the
    fractions the search chooses from and any other asked for, computed once per table.
    ``measured``: a ``samples.tiers.TierMeasurement`` (or its dict) to cost the miss path with
    instead of the topology's links; ``source`` says which the model uses."""

    def __init__(self, topology: Topology | None, num_devices: int, batch_size: int,
                 bytes_per_element: int, optimizer: str = DEFAULT_OPTIMIZER, algorithm: str = "lru",
                 measured: Any = None):
        self.measured: TierMeasurement | None = as_measurement(measured)
        self.source = TIER_COST_SOURCE if self.measured is None else self.measured.source
        topology = topology or Topology(num_devices)
        self.links = topology.tier_links()
        self.devices_per_host = ranks_per_host(topology, num_devices)
        self.batch_size = int(batch_size)
        self.bytes_per_element = int(bytes_per_element)
        self.optimizer = optimizer
        self.algorithm = algorithm
        self._curves: dict[str, tuple[float, dict[float, float]]] = {}

    def curve(self, table: Table, fractions: Sequence[float] = ()) -> tuple[float, dict[float, float]]:
        """(unique rows per batch, {fraction: miss rate}) of ``table``."""
        unique, rates = self._curves.get(table.name, (None, {}))
        wanted = sorted((set(CACHE_FRACTIONS) | {float(f) for f in fractions}) - set(rates))
        if unique is None or wanted:
            got = predict_miss_rates(table, self.batch_size, wanted or list(CACHE_FRACTIONS), self.algorithm)
            unique, rates = got.unique_per_batch, {**rates, **got.miss_rate}
            self._curves[table.name] = (unique, rates)
        return unique, rates

    def miss_rate(self, table: Table, fraction: float | None) -> float:
        """Share of a batch's unique rows not in a cache of ``fraction`` of the rows (1 without one)."""
        if fraction is None:
            return 1.0
        return self.curve(table, [fraction])[1][float(fraction)]

    def shard_ms(self, table: Table, tier: Tier, num_rows: int, num_cols: int) -> float:
        """What ``tier`` adds to a shard of ``num_rows x num_cols`` of ``table`` (0 on the device)."""
        if tier.on_device:
            return 0.0
        share = num_rows / table.num_embeddings
        unique = self.curve(table)[0] * share
        misses = self.miss_rate(table, tier.cache_fraction) * unique
        full_row = row_bytes(num_cols, self.bytes_per_element, self.optimizer)
        if self.measured is not None:  # the runtime's miss path: misses (all rows without a cache), both ways
            moved = misses if tier.cached else unique
            return float(self.measured.line(tier.memory).ms(2 * moved * full_row, batches=min(1.0, moved)))
        link = self.links["host_link_gbps"] * 1e6  # bytes per ms
        if tier.memory == "host" and not tier.cached:
            lookups = self.batch_size * table.pooling_factor * share
            return (lookups * num_cols * self.bytes_per_element + 2 * unique * full_row) / link
        ms = 2 * misses * full_row / link
        if tier.memory == "ssd":
            drive_bytes = self.links["ssd_gbps"] * 1e6 / self.devices_per_host
            drive_reads = self.links["ssd_iops"] / 1e3 / self.devices_per_host
            ms += max(2 * misses * max(full_row, SSD_READ_BYTES) / drive_bytes, 2 * misses / drive_reads)
        return float(ms)
