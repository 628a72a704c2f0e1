"""Whole plans timed on this machine: the instrument every stage of refine uses.

A plan's *measured cost* is the simulator's slowest device with each device's measured compute
in place of the estimate (communication stays modelled). Plans compared are timed together, all
their devices in one interleaved run (``config`` describes runs, passes and repeats).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..plan import Plan
from ..search.simulator import Simulator
from ..tables import TableSet
from .config import DEFAULT_CONFIG


def per_set(sets: list[list], values: np.ndarray) -> np.ndarray:
    """``values`` of the non-empty ``sets`` (timed or predicted in order) spread back over
    all of them, 0 for an empty set (an idle device)."""
    out = np.zeros(len(sets))
    out[[i for i, s in enumerate(sets) if s]] = values
    return out


def measured_cost(plan: Plan, compute: np.ndarray, tables: TableSet, models: Any, batch: int) -> float:
    """The plan's cost with ``compute`` (measured, per device, at ``batch``) in place of the
    estimate: the simulator's slowest device, communication modelled."""
    return float(Simulator.from_plan(plan, models, tables, batch).evaluate_plan(plan, compute.tolist()).max_ms[0])


def time_plans(plans: list[Plan], which: list[int], tables: TableSet, calibration: Any, models: Any,
               passes: int = DEFAULT_CONFIG.compare_passes, repeats: int = DEFAULT_CONFIG.compare_repeats
               ) -> list[tuple[float, int, np.ndarray]]:
    """``(measured cost, index, measured compute per device)`` of the plans ``which``, all
    their devices timed in ONE interleaved run (this machine's speed drifts between runs
    minutes apart: 15% seen on 10 ms sets); the cost is the simulator's total with the
    measured compute in place of the estimate."""
    every = [s for i in which for s in calibration.sim.device_sets(plans[i])]
    times = per_set(every, calibration.time(every, passes, f"timing {len(which)} plans together", repeats))
    out, first = [], 0
    for i in which:
        compute = times[first:first + plans[i].num_devices]
        first += plans[i].num_devices
        out.append((measured_cost(plans[i], compute, tables, models, calibration.models.batch_size), i, compute))
    return out


def timed_together(plans: list[Plan], tables: TableSet, calibration: Any, models: Any,
                   passes: int = DEFAULT_CONFIG.compare_passes, repeats: int = DEFAULT_CONFIG.compare_repeats,
                   runs: int = DEFAULT_CONFIG.final_check_runs) -> tuple[list[float], list[np.ndarray], list]:
    """Every device of ``plans`` timed together in ``runs`` interleaved runs (``time_plans``):
    each plan's measured cost (each device's mean over the runs, communication modelled), those
    means, and the runs themselves."""
    which = list(range(len(plans)))
    timed = [time_plans(plans, which, tables, calibration, models, passes, repeats) for _ in range(runs)]
    means = [np.mean([run[k][2] for run in timed], axis=0) for k in which]
    batch = calibration.models.batch_size
    return [measured_cost(p, m, tables, models, batch) for p, m in zip(plans, means)], means, timed


__all__ = ["per_set", "measured_cost", "time_plans", "timed_together"]
