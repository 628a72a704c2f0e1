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
from ..search.api import search_plan
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
                  timing_passes: int, algorithm: str, search_options: dict,
                  budget: Any = None) -> tuple[list[dict], list[Plan], Any]:
    """The rounds (module docstring): each searches a plan against the current models, times its
    devices (they join the calibration) and fine-tunes the models on them, but the last. Returns each
    round's record, its plan, and the models fitted last (the plans of the last round's search).
    With a ``budget`` (``measured.budget.Budget``), a round is fine-tuned for and timed only when its
    estimate fits (stage ``rounds``, the least worth per second); round 0's devices are timed only
    when round 1 fits too (they are what it fine-tunes on; the comparison times the plan anyway):
    else its record says ``timed: false``. Without enough random sets to fit (``Calibration.fittable``)
    there are no rounds: no record, no plan, the pre-trained models."""
    if budget is not None and not calibration.fittable:
        budget.skip("rounds", "calibration timed too few random sets to fit the models; the pre-trained "
                              "models' plan is compared")
        return [], [], calibration.models
    if models is None:
        models, report = calibration.fit()
    else:
        report = calibration.report
    history, plans = [], []
    for r in range(rounds + 1):
        plan = search_plan(tables, devices, memory, algorithm=algorithm, cost_models=models, **search_options)
        plans.append(plan)
        gmae_held_out = round(float(report.gmae_after), 4)
        last = r == rounds
        if budget is not None and not last and not _next_round_fits(budget, r, rounds, devices, timing_passes,
                                                                   len(calibration.features)):
            if r == 0:  # nothing to fine-tune on: round 0's plan is compared untimed
                history.append({"round": 0, "calibration_gmae_held_out": gmae_held_out, "timed": False})
                break
            last = True  # this round is the last: timed, not fine-tuned on
        if budget is not None:
            budget.say(f"round {r}: timing the plan's devices", r, rounds)
        history.append(_timed_round(r, plan, calibration, models, gmae_held_out, timing_passes, tables))
        if last:
            break
        # the rounds fine-tune the weights too: plans unlike the pre-trained model's to compare
        if budget is not None:
            budget.say(f"round {r}: fine-tuning the models on {len(calibration.features)} sets", r, rounds)
        models, report = calibration.fit(fine_tune=True)
    return history, plans, models


def _next_round_fits(budget: Any, r: int, rounds: int, devices: int, passes: int, sets: int) -> bool:
    """Whether round ``r + 1`` fits: this round's timing (``r`` = 0: not timed yet), a fine-tuning
    on ``sets`` measured sets and the next plan's timing; records the rounds skipped when not."""
    cost = (budget.timing_s(devices, passes) if r == 0 else 0.0) + budget.fine_tune_s(sets + devices) \
        + budget.timing_s(devices, passes)
    if budget.fits("rounds", cost):
        return True
    budget.skip("rounds", budget.out_of_time("rounds", f"rounds {r + 1}-{rounds} (fine-tuning on the plans' "
                                                       f"devices and searching again)", cost))
    return False


def _timed_round(r: int, plan: Plan, calibration: Any, models: Any, gmae_held_out: float, timing_passes: int,
                 tables: TableSet) -> dict:
    """Round ``r``'s record: its plan's devices timed (they join the calibration) against the models' estimate."""
    batch = calibration.models.batch_size
    sets = calibration.sim.device_sets(plan)
    used = [s for s in sets if s]
    estimated = calibration.predict(used, models)
    measured = calibration.add(used, "plan", passes=timing_passes)
    compute = per_set(sets, measured)
    cost = measured_cost(plan, compute, tables, models, batch)
    entry = {"round": r, "calibration_gmae_held_out": gmae_held_out,
             "device_gmae": round(float(gmae(estimated, measured)), 4),
             "estimated_max_compute_ms": round(float(estimated.max()), 4),
             "measured_max_compute_ms": round(float(measured.max()), 4),
             "measured_cost_ms": round(cost, 4)}
    log.info("refine round %d: the models were %.1f%% off on the plan's %d devices; measured max compute "
             "%.2f ms (estimated %.2f), measured cost %.2f ms at batch %d", r, 100 * entry["device_gmae"],
             len(used), measured.max(), estimated.max(), cost, batch)
    return entry


__all__ = ["check_refine", "round_of", "search_rounds"]
