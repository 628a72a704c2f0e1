"""Data-parallel (replicated) tables: what they cost, and when the search replicates one.

A replicated table lives whole on every device. Each device looks it up for its own
slice of the batch (``B / D`` samples: no all-to-all of its pooled outputs), and its
dense gradient (``rows x dim x 4`` bytes, fp32) is summed over the devices by a ring
all-reduce before the update. Per device, the simulator adds::

    compute  = compute model on the set of replicated tables, at the local batch B / D
               (the simulator's rule: cost linear in the batch)
    allreduce = one + peers x (D - 1) + ms_per_byte x 2 (D - 1) / D x sum(rows x dim x 4)

with the constants of the comm model's fitted row-wise reduction (``AnalyticCommModel``
``coefs[2]``: a call, per peer, per byte; the analytic part of a neural comm model),
the same on every device; with a topology that states hosts, the ring's bytes over its
slowest link (inter-host when there are several hosts) instead. Replication pays when a table is small and looked up a lot:
its compute spreads evenly and its columns leave the all-to-all, for one all-reduce of
a small table.

``choose_data_parallel`` is the NeuroShard search's decision (``search_plan(...,
data_parallel="auto")``): forward selection over the tables allowed to replicate, hot
and small first, each candidate set judged by the best classic greedy placement of the
rest; the search then runs with and without the chosen set and keeps the cheaper plan.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..constants import DATA_PARALLEL, DATA_PARALLEL_CHOICES
from ..constraints import TableConstraints
from ..errors import InfeasibleError, NeuroShardError
from .baselines import best_packing_greedy
from .simulator import replicated_bytes

if TYPE_CHECKING:
    from ..tables import Table
    from ..types import Placement
    from .simulator import Simulator

log = logging.getLogger(__name__)

#: most tables the forward selection tries adding
MAX_CANDIDATES = 8


def check_data_parallel(value: str, what: str = "data_parallel") -> str:
    if value not in DATA_PARALLEL_CHOICES:
        raise NeuroShardError(f"{what} must be one of {', '.join(DATA_PARALLEL_CHOICES)}, got {value!r}")
    return value


def may_replicate(table: "Table", num_devices: int) -> bool:
    """Its constraints allow data_parallel, and pin it to no fewer than all devices."""
    rule = TableConstraints.of(table)
    return rule.allows(DATA_PARALLEL) and (rule.devices is None or len(set(rule.devices)) >= num_devices)


def must_replicate(table: "Table") -> bool:
    """Its constraints allow only data_parallel."""
    return TableConstraints.of(table).sharding_types == frozenset({DATA_PARALLEL})


def candidates(sim: "Simulator", memory_bytes: int) -> list[str]:
    """Tables the search may replicate, most promising first: allowed by their constraints,
    at most half a device, ordered by lookups per byte (hot and small first)."""
    out = []
    for t in sim.tables:
        size = replicated_bytes(sim, [t.name])
        if may_replicate(t, sim.num_devices) and size <= np.min(memory_bytes) / 2 and t.pooling_factor > 0:  # per-device: smallest
            out.append((-t.pooling_factor * t.embedding_dim / size, t.name))
    return [name for _, name in sorted(out)][:MAX_CANDIDATES]


def greedy_cost_ms(sim: "Simulator", memory_bytes: int, seed: int) -> float:
    """The simulated cost of the best classic greedy plan of ``sim`` (inf when none packs)."""
    try:
        placed = best_packing_greedy(sim, memory_bytes, seed)
    except InfeasibleError:
        return float("inf")
    return float("inf") if placed is None else placed.cost_ms


def choose_data_parallel(sim: "Simulator", memory_bytes: int, seed: int = 0) -> list[str]:
    """Tables to replicate: those whose constraints allow only data-parallel, then forward
    selection over ``candidates`` (add one while the best greedy plan gets cheaper)."""
    if sim.num_devices < 2:
        return []
    forced = [t.name for t in sim.tables if must_replicate(t)]
    chosen = list(forced)
    best = greedy_cost_ms(sim.with_data_parallel(chosen), memory_bytes - replicated_bytes(sim, chosen), seed)
    for name in candidates(sim, memory_bytes):
        if name in chosen or len(chosen) + 1 >= len(sim.tables):  # keep one table sharded
            continue
        trial = chosen + [name]
        room = memory_bytes - replicated_bytes(sim, trial)
        cost = greedy_cost_ms(sim.with_data_parallel(trial), room, seed) if np.all(room > 0) else float("inf")
        log.debug("replicate %s: greedy %.4f ms (best so far %.4f ms)", trial, cost, best)
        if cost < best - 1e-9:
            chosen, best = trial, cost
    return [t.name for t in sim.tables if t.name in chosen]  # in table order


def forced_tables(tables) -> list[str]:
    """Tables whose constraints allow only data-parallel sharding."""
    return [t.name for t in tables if must_replicate(t)]


def search_with_replication(sim: "Simulator", memory_bytes: int, run) -> tuple["Simulator", "Placement"]:
    """The cheaper of the search without replication and with the tables ``choose_data_parallel``
    picks (``run(sim, memory_bytes) -> Placement`` searches one simulator; the replicated tables'
    memory comes off every device). Returns the simulator the placement is for, and the
    placement with the decision in ``details['data_parallel']``."""
    chosen = choose_data_parallel(sim, memory_bytes)
    forced = forced_tables(sim.tables)
    results = {}
    if not forced:
        results["sharded"] = (sim, run(sim, memory_bytes))
    if chosen:
        replicated = sim.with_data_parallel(chosen)
        results["replicated"] = (replicated, run(replicated, memory_bytes - replicated_bytes(sim, chosen)))
    if not results:
        raise InfeasibleError(f"the tables that allow only data-parallel sharding ({', '.join(forced)}) "
                              f"do not fit replicated on every device")
    key = min(results, key=lambda k: results[k][1].cost_ms)
    best_sim, placement = results[key]
    placement.details["data_parallel"] = {
        "mode": "auto", "tables": list(best_sim.data_parallel_tables), "tried": chosen,
        "simulated_cost_ms": {k: round(float(p.cost_ms), 6) for k, (_, p) in results.items()}}
    log.info("data-parallel: %s (simulated %s)", list(best_sim.data_parallel_tables) or "none",
             placement.details["data_parallel"]["simulated_cost_ms"])
    return best_sim, placement
