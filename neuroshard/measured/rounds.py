"""Refine's rounds: search a plan, time its devices here, fine-tune the models on them, search again.

A search goes where its cost model is most wrong: it prefers the device sets the model
underestimates. Random calibration sets rarely are those sets; the devices of the plans the
search proposes are. So each round searches a plan against the current (calibrated) models,
times its devices on this machine (``refine_passes`` passes each; sets the models never saw,
their error recorded), adds them to the calibration data and fine-tunes the pre-trained model
again; the last round's models search once more (docs/decisions.md#refine-loop).
"""
from __future__ import annotations

import logging
from typing import Any

from ..costmodels.metrics import gmae
from ..errors import NeuroShardError
from ..plan import Plan
from ..search.api import shard
from ..search.registry import get_trait, with_trait
from ..tables import TableSet
from ..validate import check_int
from .config import DEFAULT_CONFIG
from .plan_timing import measured_cost, per_set

log = logging.getLogger("neuroshard.measured.refine")  # the loop's stages log as refine


def check_refine(algorithm: str, rounds: Any, default: int = DEFAULT_CONFIG.rounds) -> int:
    """The number of rounds (``True``: ``default``), checked with the algorithm."""
    if not get_trait(algorithm, "model_guided"):
        raise NeuroShardError(f"refinement corrects the cost models a search uses; algorithm '{algorithm}' does not "
                              f"use them (choose {' or '.join(with_trait('model_guided'))})")
    return default if rounds is True else check_int(rounds, "refine (rounds)", 0, 20)


def round_of(i: int, history: list[dict]) -> int | None:
    """The round whose plan is ``plans[i]`` (the rounds' plans come first), or None."""
    return i if i < len(history) else None


def search_rounds(tables: TableSet, devices: int, memory: Any, calibration: Any, models: Any, rounds: int,
                  timing_passes: int, algorithm: str, search_options: dict) -> tuple[list[dict], list[Plan], Any]:
    """The rounds (module docstring): each searches a plan against the current models, times its
    devices (they join the calibration) and fine-tunes the models on them, but the last. Returns each
    round's record, its plan, and the models fitted last (the plans of the last round's search)."""
    batch = calibration.models.batch_size
    if models is None:
        models, report = calibration.fit()
    else:
        report = calibration.report
    history, plans = [], []
    for r in range(rounds + 1):
        plan = shard(tables, devices, memory, algorithm=algorithm, cost_models=models, **search_options)
        sets = calibration.sim.device_sets(plan)
        used = [s for s in sets if s]
        estimated = calibration.predict(used, models)
        measured = calibration.add(used, "plan", passes=timing_passes)
        compute = per_set(sets, measured)
        cost = measured_cost(plan, compute, tables, models, batch)
        history.append({"round": r, "calibration_gmae_held_out": round(float(report.gmae_after), 4),
                        "device_gmae": round(float(gmae(estimated, measured)), 4),
                        "estimated_max_compute_ms": round(float(estimated.max()), 4),
                        "measured_max_compute_ms": round(float(measured.max()), 4),
                        "measured_cost_ms": round(cost, 4)})
        log.info("refine round %d: the models were %.1f%% off on the plan's %d devices; measured max compute "
                 "%.2f ms (estimated %.2f), measured cost %.2f ms at batch %d", r, 100 * history[-1]["device_gmae"],
                 len(used), measured.max(), estimated.max(), cost, batch)
        plans.append(plan)
        if r < rounds:  # the rounds fine-tune the weights too: plans unlike the pre-trained model's to compare
            models, report = calibration.fit(fine_tune=True)
    return history, plans, models


__all__ = ["check_refine", "round_of", "search_rounds"]
