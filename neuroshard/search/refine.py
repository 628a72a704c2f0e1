"""Measured refinement: search, time the plan's devices here, fine-tune on them, search again.

A search goes where its cost model is most wrong: it prefers the device sets the model
underestimates. Random calibration sets rarely are those sets; the devices of the plans
the search proposes are. ``refine`` therefore continues a calibration
(``costmodels.calibrate.Calibration``: the task's tables alone and random device-sized
sets, measured on this machine) for ``rounds`` rounds:

1. search a plan against the current (calibrated) models;
2. time its devices on this machine (``timing_rounds`` runs each, ``neuroshard
   measure``'s protocol) and record the models' error on them: sets they never saw;
3. add them to the calibration data and fine-tune the pre-trained model again.

The plan of the last round's models is searched too (and timed), and the plan returned is
the one whose measured cost is lowest: each device's measured compute plus the modelled
communication (the simulator's total, with the measured compute in place of the
estimate). Its provenance records every round. A round costs one search, ``D`` timed
device sets and one fine-tuning: about a minute for 8 devices on 2 CPU cores.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..costmodels.metrics import gmae
from ..errors import NeuroShardError
from ..plan import Plan
from ..tables import TableSet
from ..validate import check_int

log = logging.getLogger(__name__)

DEFAULT_ROUNDS = 2
#: runs per device set when a plan's devices are timed (median)
TIMING_ROUNDS = 3
#: the algorithms that search against the cost models, the only ones refinement can correct
REFINABLE = ("neuroshard", "bayes")


def check_refine(algorithm: str, rounds: Any) -> int:
    """The number of rounds (``True``: ``DEFAULT_ROUNDS``), checked with the algorithm."""
    if algorithm not in REFINABLE:
        raise NeuroShardError(f"refinement corrects the cost models a search uses; algorithm '{algorithm}' does not "
                              f"use them (choose {' or '.join(REFINABLE)})")
    return DEFAULT_ROUNDS if rounds is True else check_int(rounds, "refine (rounds)", 0, 20)


def refine(tables: TableSet, devices: int, memory: Any, calibration: Any, rounds: int = DEFAULT_ROUNDS,
           timing_rounds: int = TIMING_ROUNDS, algorithm: str = "neuroshard", models: Any = None,
           **search_options: Any) -> Plan:
    """Search ``rounds + 1`` plans, each against models fine-tuned on the devices of the
    plans before it (see the module docstring), and return the one measured cheapest.
    ``calibration`` is a ``Calibration`` with its random sets measured (``start_calibration``);
    ``models``: what ``calibration.fit()`` gave, when already fitted. ``search_options`` go
    to ``search.api.shard``."""
    from ..runtime.measure_plan import plan_simulator
    from .api import shard
    rounds = check_refine(algorithm, rounds)
    batch = calibration.models.batch_size
    if models is None:
        models, report = calibration.fit()
    else:
        report = calibration.report
    history, plans = [], []
    for r in range(rounds + 1):
        plan = shard(tables, devices, memory, algorithm=algorithm, cost_models=models, **search_options)
        pieces, where = calibration.sim.pieces_of_plan(plan)
        sets = [[p for p, d in zip(pieces, where) if d == device] for device in range(plan.num_devices)]
        used = [i for i, s in enumerate(sets) if s]
        estimated = calibration.predict([sets[i] for i in used], models)
        measured = calibration.add([sets[i] for i in used], "plan", rounds=timing_rounds)
        compute = np.zeros(plan.num_devices)
        compute[used] = measured
        cost = float(plan_simulator(plan, tables, batch, models).evaluate_plan(plan, compute.tolist()).max_ms[0])
        history.append({"round": r, "calibration_gmae_held_out": round(float(report.gmae_after), 4),
                        "device_gmae": round(float(gmae(estimated, measured)), 4),
                        "estimated_max_compute_ms": round(float(estimated.max()), 4),
                        "measured_max_compute_ms": round(float(measured.max()), 4),
                        "measured_cost_ms": round(cost, 4)})
        log.info("refine round %d: the models were %.1f%% off on the plan's %d devices; measured max compute "
                 "%.2f ms (estimated %.2f), measured cost %.2f ms at batch %d", r, 100 * history[-1]["device_gmae"],
                 len(used), measured.max(), estimated.max(), cost, batch)
        plans.append(plan)
        if r < rounds:
            models, report = calibration.fit()
    best = int(np.argmin([h["measured_cost_ms"] for h in history]))
    chosen = plans[best]
    chosen.provenance["refine"] = {"rounds": history, "chosen_round": best, "timing_rounds": timing_rounds,
                                   "batch_size": batch, "hardware": calibration.config.get("hardware", "")}
    return chosen


__all__ = ["refine", "check_refine", "DEFAULT_ROUNDS", "REFINABLE"]
