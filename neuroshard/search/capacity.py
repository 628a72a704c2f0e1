"""Capacity planning (MTrainS's question): how many devices does a model need when its
tables may live in host memory or on SSD behind device caches, against keeping every row
in device memory?

``plan_capacity`` searches (no timing of hardware) whole hosts of ``local_world_size``
devices:

1. **device memory only**: the fewest hosts whose devices hold every table (the first
   count from the memory lower bound up whose search succeeds without tiers), and that
   plan's estimated cost ``c1``;
2. **tiered**: the fewest hosts, from one up, whose tiered plan (``search.tiers``) costs
   at most ``slowdown x c1``: the devices a user may save by spending host memory and SSD.

Both costs are the plans' estimates (the slowest device's embedding cost per iteration,
with the tiers' modelled traffic: ``costmodels.tiers``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from ..constants import TIER_PACKING_HEADROOM
from ..errors import InfeasibleError, NeuroShardError
from ..optimizers import DEFAULT_OPTIMIZER, tables_bytes
from ..plan import Plan
from ..tables import TableSet
from ..topology import make_topology
from ..validate import check_memory, check_number
from .api import search_plan

log = logging.getLogger(__name__)

#: hosts tried at most, each way (a guard against a search that never fits)
MAX_HOSTS_TRIED = 64


@dataclass
class CapacityReport:
    """Devices and estimated cost, all in device memory and tiered, and the tiered plan."""

    device_memory_only: dict
    tiered: dict
    plan: Plan | None
    tried: list[dict]

    def to_dict(self) -> dict:
        return {"device_memory_only": self.device_memory_only, "tiered": self.tiered, "tried": self.tried}


def plan_capacity(tables: TableSet, device_memory: Any, local_world_size: int, *, host_memory: Any = None,
                  ssd: Any = None, slowdown: float = 1.10, algorithm: str = "neuroshard", cost_models: Any = None,
                  optimizer: str = DEFAULT_OPTIMIZER, bytes_per_element: int = 4, relative_speed: float = 1.0,
                  **topology: Any) -> CapacityReport:
    """The capacity report of the module docstring (``topology``: link figures as in
    ``make_topology``, e.g. ``host_link_gbps``; ``relative_speed``: every device this many
    times as fast as the cost models' hardware, as a topology's ``relative_speed``)."""
    memory = check_memory(device_memory)
    slowdown = check_number(slowdown, "slowdown", 1.0, 100.0)
    if host_memory is None and ssd is None:
        raise NeuroShardError("capacity needs host memory (--host-memory) or SSD (--ssd) to compare with")
    total = tables_bytes(tables, bytes_per_element, optimizer)
    tried: list[dict] = []

    def search(hosts: int, tiers: bool) -> Plan | None:
        devices = hosts * local_world_size
        topo = make_topology(devices, local_world_size, relative_speed=[relative_speed] * devices,
                             **({"host_memory_bytes": host_memory, "ssd_bytes": ssd, **topology} if tiers
                                else topology))
        try:
            plan = search_plan(tables, devices, memory, algorithm, cost_models=cost_models, optimizer=optimizer,
                               bytes_per_element=bytes_per_element, topology=topo)
        except InfeasibleError as exc:
            tried.append({"devices": devices, "tiered": tiers, "fits": False, "why": str(exc)[:200]})
            return None
        cost = float(plan.estimate["max_device_cost_ms"])
        tried.append({"devices": devices, "tiered": tiers, "fits": True, "cost_ms": round(cost, 6)})
        log.info("%d devices%s: %.4f ms", devices, " (tiers)" if tiers else "", cost)
        return plan

    first = max(1, math.ceil(total / (memory * TIER_PACKING_HEADROOM * local_world_size)))
    flat = None
    for hosts in range(first, first + MAX_HOSTS_TRIED):
        flat = search(hosts, tiers=False)
        if flat is not None:
            break
    if flat is None:
        raise InfeasibleError(f"tables '{tables.name}' fit in no device-memory-only plan of {first} to "
                              f"{first + MAX_HOSTS_TRIED - 1} hosts of {local_world_size} devices")
    c1 = float(flat.estimate["max_device_cost_ms"])
    tiered_plan = None
    for hosts in range(1, flat.num_devices // local_world_size + 1):
        plan = search(hosts, tiers=True)
        if plan is not None and float(plan.estimate["max_device_cost_ms"]) <= slowdown * c1:
            tiered_plan = plan
            break
    if tiered_plan is None:  # never worse than all in device memory: the tiered search of that many
        tiered_plan = flat
    c2 = float(tiered_plan.estimate["max_device_cost_ms"])
    return CapacityReport({"devices": flat.num_devices, "cost_ms": round(c1, 6)},
                          {"devices": tiered_plan.num_devices, "cost_ms": round(c2, 6),
                           "slowdown": round(c2 / c1, 4) if c1 > 0 else None,
                           "allowed_slowdown": slowdown, "tiered_tables": _tiered_count(tiered_plan)},
                          tiered_plan, tried)


def _tiered_count(plan: Plan) -> int:
    return sum(1 for tier in plan.tiers().values() if not tier.on_device)


def describe(report: CapacityReport) -> str:
    """Two lines a person reads: devices and cost each way."""
    flat, tiered = report.device_memory_only, report.tiered
    saved = flat["devices"] - tiered["devices"]
    return (f"all rows in device memory: {flat['devices']} devices, estimated {flat['cost_ms']:.4f} ms per iteration\n"
            f"tiered (host memory / SSD behind device caches): {tiered['devices']} devices, estimated "
            f"{tiered['cost_ms']:.4f} ms ({tiered['slowdown']}x, allowed {tiered['allowed_slowdown']}x; "
            f"{tiered['tiered_tables']} tables outside device memory): "
            + (f"{saved} devices fewer" if saved > 0 else "no devices saved"))

