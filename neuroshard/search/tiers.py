"""Search across memory tiers: which tables keep their rows in device memory, which in
host memory or on SSD behind a device cache, and how large each cache is.

When the tables do not fit in ``TIER_PACKING_HEADROOM`` of the devices' memory and the
topology states host memory or SSD (``--host-memory``, ``--ssd``), ``choose_tiers``
decides a tier per table before any placement (TorchRec runs one kernel per table, so
every shard of a table shares it); the placement algorithm then packs what stays on the
devices (whole tables and caches) and balances the devices' costs, each piece costed
with its tier's traffic (``costmodels.tiers``).

The choice minimises the sum over tables of the traffic the tiers add (the tier cost
model, analytic or measured), under the devices' memory, as a multiple-choice knapsack solved greedily: every
table starts with no device bytes (rows in host memory without a cache, else on SSD);
then, while device memory remains, the table whose next step up (a larger cache
``CACHE_FRACTIONS``, or all rows on the device) saves the most milliseconds per device
byte takes it (TorchRec's ``EmbeddingOffloadScaleupProposer`` hands spare device memory
to tables by cacheability x lookups in the same spirit; here the saving is the model's).
Which tables live in host memory and which on SSD is decided between two such passes:
host memory goes to the tables whose SSD traffic would cost most per byte, up to
``TIER_PACKING_HEADROOM`` of the hosts' memory; the rest go to SSD; the second pass
re-chooses caches with those costs (and when it moves tables off the devices whose rows
then overflow the hosts, a third pass runs with every table's memory decided first:
``_within_host``). The sum is a proxy for the slowest device: the
placement balances what it leaves.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from ..constants import CACHE_FRACTIONS, TIER_PACKING_HEADROOM
from ..errors import InfeasibleError
from ..optimizers import shard_bytes, tables_bytes
from ..tiers import IN_DEVICE_MEMORY, Tier
from ..units import format_bytes
from .simulator import Simulator, replicated_bytes


def _levels(memory: str) -> list[Tier]:
    """The levels a table may take with rows in ``memory``, fewest device bytes first."""
    return [Tier(memory), *(Tier(memory, f) for f in CACHE_FRACTIONS), IN_DEVICE_MEMORY]


def needs_tiers(sim: Simulator, memory_bytes) -> bool:
    """Whether the tables overflow ``TIER_PACKING_HEADROOM`` of the devices' memory."""
    return _sharded_bytes(sim) > TIER_PACKING_HEADROOM * _device_room(sim, memory_bytes)


def _device_room(sim: Simulator, memory_bytes) -> float:
    limits = np.broadcast_to(np.asarray(sim.memory_limits(memory_bytes), dtype=np.float64), (sim.num_devices,))
    return float(limits.sum()) - sim.num_devices * replicated_bytes(sim, sim.data_parallel_tables)


def _sharded_bytes(sim: Simulator) -> float:
    return float(tables_bytes((t for t in sim.tables if t.name not in sim.data_parallel_tables),
                              sim.bytes_per_element, sim.optimizer))


def choose_tiers(sim: Simulator, memory_bytes) -> tuple[list[Tier] | None, dict]:
    """One tier per table of ``sim`` (None when every table fits in device memory), and the
    record the plan's provenance keeps (``tiers``). InfeasibleError (one line) when the
    tables fit in no tier combination."""
    if not needs_tiers(sim, memory_bytes):
        return None, {}
    topo = sim.topology
    hosts = 1 if topo is None else int(topo.tier_host_of().max()) + 1
    host_room = 0 if topo is None or topo.host_memory_bytes is None else topo.host_memory_bytes * hosts
    ssd_room = 0 if topo is None or topo.ssd_bytes is None else topo.ssd_bytes * hosts
    need, room = _sharded_bytes(sim), _device_room(sim, memory_bytes)
    if not host_room and not ssd_room:  # no other tier: the placers pack the devices as full as they can
        return None, {}
    if need > TIER_PACKING_HEADROOM * room + host_room + ssd_room:
        raise InfeasibleError(
            f"tables '{sim.tables.name}' need {format_bytes(need)}; the devices ({format_bytes(room)}, "
            f"{TIER_PACKING_HEADROOM:.0%} of it usable), host memory ({format_bytes(host_room)}) and SSD "
            f"({format_bytes(ssd_room)}) of {hosts} host{'s' if hosts > 1 else ''} hold less")
    names = [t.name for t in sim.tables]
    sharded = [i for i, t in enumerate(sim.tables) if t.name not in sim.data_parallel_tables]
    budget = TIER_PACKING_HEADROOM * room
    backing = {i: ("host" if host_room else "ssd") for i in sharded}
    chosen = _knapsack(sim, sharded, backing, budget)
    if host_room and ssd_room:  # host memory to the tables SSD would cost most per byte, the rest on SSD
        off = [i for i in sharded if not chosen[i].on_device]
        full = {i: _full_bytes(sim, i) for i in off}
        worse = {i: (_cost(sim, i, Tier("ssd", chosen[i].cache_fraction)) - _cost(sim, i, chosen[i])) / full[i]
                 for i in off}
        left = TIER_PACKING_HEADROOM * host_room
        for i in sorted(off, key=lambda i: -worse[i]):
            backing[i] = "host" if full[i] <= left else "ssd"
            left -= full[i] if backing[i] == "host" else 0
        chosen = _knapsack(sim, sharded, backing, budget)
        if _backed_bytes(sim, chosen, "host") > host_room:
            chosen = _within_host(sim, sharded, chosen, backing, budget, host_room)
    _check_backing(sim, chosen, host_room, ssd_room)
    tiers = [chosen.get(i, IN_DEVICE_MEMORY) for i in range(len(names))]
    counts: dict[str, int] = {}
    for i in sharded:
        kind = "device" if tiers[i].on_device else (f"{tiers[i].memory}+cache" if tiers[i].cached else tiers[i].memory)
        counts[kind] = counts.get(kind, 0) + 1
    record = {"model": sim.tier_model().source, "tables": counts,
              "device_bytes_needed_all_on_device": int(need), "device_bytes": int(room),
              "tier_cost_ms": round(float(sum(_cost(sim, i, tiers[i]) for i in sharded)), 6),
              "links": (topo.tier_links() if topo is not None else {})}
    return tiers, record


def _full_bytes(sim: Simulator, i: int) -> int:
    t = sim.tables[i]
    return shard_bytes(t.num_embeddings, t.embedding_dim, sim.bytes_per_element, sim.optimizer)


def _device_bytes(sim: Simulator, i: int, tier: Tier) -> int:
    t = sim.tables[i]
    return tier.device_bytes(t.num_embeddings, t.embedding_dim, sim.bytes_per_element, sim.optimizer)


def _cost(sim: Simulator, i: int, tier: Tier) -> float:
    t = sim.tables[i]
    return sim.tier_model().shard_ms(t, tier, t.num_embeddings, t.embedding_dim)


def _knapsack(sim: Simulator, tables: list[int], backing: dict[int, str], budget: float) -> dict[int, Tier]:
    """Each table's level: the greedy of the module docstring (best saving per device byte first)."""
    levels = {i: _levels(backing[i]) for i in tables}
    bytes_ = {i: [_device_bytes(sim, i, tier) for tier in levels[i]] for i in tables}
    costs = {i: [_cost(sim, i, tier) for tier in levels[i]] for i in tables}
    at = {i: 0 for i in tables}
    left = budget - sum(bytes_[i][0] for i in tables)
    if left < 0:
        raise InfeasibleError(f"tables '{sim.tables.name}': even without device caches the devices' memory is "
                              f"short by {format_bytes(-left)}")

    def best_step(i: int, room: float) -> tuple[float, int] | None:
        now = at[i]
        best = None
        for j in range(now + 1, len(levels[i])):
            extra = bytes_[i][j] - bytes_[i][now]
            if extra > room:
                break  # levels grow in bytes
            gain = costs[i][now] - costs[i][j]
            rate = gain / max(extra, 1.0)
            if gain > 0 and (best is None or rate > best[0]):
                best = (rate, j)
        return best

    heap = []
    for i in tables:
        step = best_step(i, left)
        if step is not None:
            heapq.heappush(heap, (-step[0], i, at[i], step[1]))
    while heap:
        _, i, was, j = heapq.heappop(heap)
        if at[i] != was:
            continue
        extra = bytes_[i][j] - bytes_[i][was]
        if extra > left:  # the room shrank since: the best step that still fits
            step = best_step(i, left)
            if step is not None:
                heapq.heappush(heap, (-step[0], i, at[i], step[1]))
            continue
        at[i], left = j, left - extra
        step = best_step(i, left)
        if step is not None:
            heapq.heappush(heap, (-step[0], i, at[i], step[1]))
    return {i: levels[i][at[i]] for i in tables}


def _backed_bytes(sim: Simulator, chosen: dict[int, Tier], memory: str) -> int:
    """Bytes the tables of ``chosen`` keep in ``memory`` (host or ssd)."""
    return sum(_full_bytes(sim, i) for i, tier in chosen.items() if tier.memory == memory)


def _within_host(sim: Simulator, tables: list[int], chosen: dict[int, Tier], backing: dict[int, str],
                 budget: float, host_room: float) -> dict[int, Tier]:
    """The knapsack again when its second pass moved tables off the devices whose rows then
    overflow the hosts (they kept the host backing of the first pass): this time every table's
    backing is set before it, host memory up to ``TIER_PACKING_HEADROOM`` of the hosts' for the
    tables off the devices first (the SSD would slow them most per byte), then for those on the
    devices (the same order), the rest on SSD, so no choice overflows the hosts."""
    full = {i: _full_bytes(sim, i) for i in tables}

    def worse(i: int) -> float:
        tier = chosen[i] if not chosen[i].on_device else Tier("host")
        return (_cost(sim, i, Tier("ssd", tier.cache_fraction)) - _cost(sim, i, tier)) / full[i]

    backing = dict(backing)
    left = TIER_PACKING_HEADROOM * host_room
    for i in sorted(tables, key=lambda i: (chosen[i].on_device, -worse(i))):
        backing[i] = "host" if full[i] <= left else "ssd"
        left -= full[i] if backing[i] == "host" else 0
    return _knapsack(sim, tables, backing, budget)


def _check_backing(sim: Simulator, chosen: dict[int, Tier], host_room: float, ssd_room: float) -> None:
    for memory, room, flag in (("host", host_room, "--host-memory"), ("ssd", ssd_room, "--ssd")):
        used = _backed_bytes(sim, chosen, memory)
        if used > room:
            raise InfeasibleError(f"tables '{sim.tables.name}' need {format_bytes(used)} in "
                                  f"{'host memory' if memory == 'host' else 'SSD'}, the hosts hold "
                                  f"{format_bytes(room)} ({flag})")
    if not math.isfinite(sum(_cost(sim, i, t) for i, t in chosen.items())):
        raise InfeasibleError(f"tables '{sim.tables.name}': the tier costs are not finite")
