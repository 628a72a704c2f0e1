"""Refine's choice rules: which of the plans timed together is kept.

- *comparison run*: every distinct plan (the rounds' and the candidates') timed in ONE
  interleaved run, its cost each device's measured compute plus the modelled communication;
- *finalists*: the cheapest few, and any within a margin of the cheapest, timed in more runs
  and judged by each device's median over them (docs/decisions.md#refine-finalists);
- *tie*: costs within ``tie_margin`` of the cheapest tie, and the plan of least total compute
  wins (docs/decisions.md#tie-margin);
- *work priced*: a plan doing more than ``work_allowance`` more total compute than the least
  of its run must be faster on its slowest device by that excess (docs/decisions.md#work-priced);
- *lean*: the plan of least total compute near the cheapest, polished too (docs/decisions.md#lean-plan);
- *final check*: a changed plan (polished, lean) timed beside the plan it came from, kept only
  when it measures cheaper there.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import NeuroShardError
from ..plan import Plan
from ..tables import TableSet
from .config import DEFAULT_CONFIG, RefineConfig
from .plan_timing import measured_cost, time_plans, timed_together

log = logging.getLogger("neuroshard.measured.refine")  # the loop's stages log as refine


@dataclass
class Choice:
    """What ``compare_plans`` found: ``best`` (the index of the plan chosen), ``cheapest`` (the finalist of
    least median cost; ``best`` unless a tie went to less work), ``compute`` (``best``'s devices as its
    runs measured them), ``lean`` (the plan of least total work, or None: ``lean_candidate``), ``first`` (each
    plan's devices in the comparison run), ``latest_ms`` (... and a finalist's device medians) and
    ``timed`` (every timing run of whole plans: what the rebalance's marginal costs are fitted to) and
    ``least_work`` (the plan whose devices measured the least total compute in the comparison run)."""
    best: int
    cheapest: int
    compute: np.ndarray
    lean: int | None
    first: dict
    latest_ms: dict
    timed: list
    least_work: int


def compare_plans(plans: list[Plan], entries: list[dict], tables: TableSet, calibration: Any, models: Any,
                  config: RefineConfig = DEFAULT_CONFIG, budget: Any = None, first: int = 0,
                  keep: Callable[[int], None] | None = None) -> Choice | None:
    """Every distinct plan timed in ONE interleaved run (``time_plans``), the finalists (``pick_finalists``)
    timed ``finalist_runs`` times in all and chosen by the cost of each device's median over the runs, a
    tie within ``tie_margin`` going to less total work, each cost priced for work beyond ``work_allowance``
    over the finalists' least (``less_work_wins``). Writes each plan's figures into its ``entries`` record.
    With a ``budget``: only the plans whose run fits are timed (``within_budget``: ``plans[first]``, the
    plain search's, and the others the models estimate cheapest; the rest's records say ``skipped``), the
    finalists' runs only when they fit (stage ``finalists``; else the first run decides), and None when
    fewer than two plans fit (nothing timed). ``keep(i)``: told the cheapest plan of the first run."""
    batch = calibration.models.batch_size
    passes, repeats = config.compare_passes, config.compare_repeats
    distinct = {p.layout_key(): i for i, p in reversed(list(enumerate(plans)))}  # the first of each plan
    which = sorted(distinct.values())
    if budget is not None:
        which = within_budget(plans, which, entries, first, calibration, models, budget)
        if not which:
            return None
        budget.say(f"timing {len(which)} plans together")
    finals = time_plans(plans, which, tables, calibration, models, passes, repeats)
    timed = [finals]
    for cost, i, _ in finals:
        entries[i]["final_measured_cost_ms"] = round(cost, 4)
    if keep is not None:
        keep(min(finals, key=lambda f: (f[0], f[1]))[1])
    # the cheapest of ~10 plans timed once is partly the luckiest: the finalists are timed finalist_runs
    # times in all, together, and chosen by the cost of each device's median over the runs (one slow run
    # of a device does not decide)
    finalists = pick_finalists(finals, config.finalist_margin, config.min_finalists, config.max_finalists)
    if len(finalists) > 1 and budget is not None:
        cost = budget.timing_s(len(finalists) * plans[which[0]].num_devices, passes, config.finalist_runs - 1)
        if not budget.fits("finalists", cost):
            budget.skip("finalists", budget.out_of_time("finalists", f"{len(finalists)} finalists' "
                                                        f"{config.finalist_runs - 1} more runs", cost)
                        + "; the first run decides")
            return _chosen(plans, finals, finalists, timed, tables, models, config)
        budget.say(f"timing {len(finalists)} finalists again")
    if len(finalists) > 1:
        which = [f[1] for f in finalists]
        runs = [{i: (c, comp) for c, i, comp in finals if i in which}]
        for _ in range(config.finalist_runs - 1):
            timed.append(time_plans(plans, which, tables, calibration, models, passes, repeats))
            runs.append({i: (c, comp) for c, i, comp in timed[-1]})
        finalists = []
        for i in which:
            per_run = np.array([run[i][1] for run in runs])  # (runs, devices)
            median = np.median(per_run, axis=0)
            finalists.append((measured_cost(plans[i], median, tables, models, batch), i, median))
            entries[i]["final_measured_cost_ms_again"] = round(runs[1][i][0], 4)
            entries[i]["final_runs_cost_ms"] = [round(run[i][0], 4) for run in runs]
            entries[i]["final_mean_cost_ms"] = round(measured_cost(plans[i], per_run.mean(axis=0), tables, models,
                                                                   batch), 4)
            entries[i]["final_median_cost_ms"] = round(finalists[-1][0], 4)
            entries[i]["final_median_total_compute_ms"] = round(float(np.sum(median)), 4)
    return _chosen(plans, finals, finalists, timed, tables, models, config)


def _chosen(plans: list[Plan], finals: list, finalists: list, timed: list, tables: TableSet, models: Any,
            config: RefineConfig) -> Choice:
    """The ``Choice`` among ``finalists`` (``(cost, index, compute)``), ``finals`` being the comparison run."""
    cheapest = min(finalists, key=lambda f: (f[0], f[1]))[1]
    best = less_work_wins([(c, i, float(np.sum(comp))) for c, i, comp in finalists], config.tie_margin,
                          config.work_allowance)
    compute = next(comp for _, i, comp in finalists if i == best)
    first = {i: comp for _, i, comp in finals}  # the comparison run: every plan timed together
    least_work = min(first, key=lambda i: (float(np.sum(first[i])), i))
    return Choice(best=best, cheapest=cheapest, compute=compute,
                  lean=lean_candidate(finals, best, config.lean_margin, config.lean_saving), first=first,
                  latest_ms=first | {i: comp for _, i, comp in finalists}, timed=timed, least_work=least_work)


def within_budget(plans: list[Plan], which: list[int], entries: list[dict], first: int, calibration: Any,
                  models: Any, budget: Any) -> list[int]:
    """Of the distinct plans ``which``, those the comparison run times within ``budget`` (stage ``compare``):
    all when they fit; else ``first`` (the plain search's plan, what is written without timing) and the
    others of least estimated slowest device (``models``' compute on their devices), as many as fit; the
    records of the others say ``skipped``. Empty (the stage skipped) when fewer than two fit."""
    if not budget.bounded:
        return which
    devices = plans[which[0]].num_devices
    per_plan = max(budget.timing_s(devices), 1e-9)
    # the comparison's first budget_compare_plans plans come first of all stages; more of them only
    # when the rebalance's estimate still fits beside them (``Budget.reserved``)
    fit = min(int(budget.room("compare") // per_plan),
              max(budget.config.budget_compare_plans, int(budget.room("polish") // per_plan)))
    if fit >= len(which):
        return which
    if fit < 2:
        budget.skip("compare", budget.out_of_time("compare", "timing two plans together", budget.timing_s(2 * devices))
                    + "; the plain search's plan is written untimed")
        return []

    def estimate(i: int) -> float:
        used = [s for s in calibration.sim.device_sets(plans[i]) if s]
        return float(np.max(calibration.predict(used, models))) if used else 0.0

    ranked = sorted((i for i in which if i != first), key=lambda i: (estimate(i), i))
    kept = sorted(([first] if first in which else []) + ranked[:fit - (first in which)])
    for i in set(which) - set(kept):
        entries[i]["skipped"] = "not timed: the budget fits the plans the models estimate cheapest"
    budget.skip("compare", f"{len(which) - len(kept)} of {len(which)} plans not timed: {fit} fit in the "
                           f"{budget.room('compare'):.0f} s left for the comparison")
    return kept


def pick_finalists(finals: list[tuple[float, int, np.ndarray]], margin: float = DEFAULT_CONFIG.finalist_margin,
                   least: int = DEFAULT_CONFIG.min_finalists, most: int = DEFAULT_CONFIG.max_finalists
                   ) -> list[tuple[float, int, np.ndarray]]:
    """The plans of one timing run (``(cost, index, compute)``) that are timed again: the
    ``least`` cheapest and any other within ``margin`` of the cheapest, at most ``most``, the
    cheapest first."""
    ranked = sorted(finals, key=lambda f: (f[0], f[1]))
    top = ranked[0][0]
    return [f for k, f in enumerate(ranked) if k < least or f[0] <= top * (1 + margin)][:most]


def lean_candidate(finals: list[tuple[float, int, np.ndarray]], best: int, margin: float = DEFAULT_CONFIG.lean_margin,
                   saving: float = DEFAULT_CONFIG.lean_saving) -> int | None:
    """The plan of one timing run (``(cost, index, compute)``) whose devices measured the least total
    compute among those within ``margin`` of the cheapest, when it is not ``best`` and saves at
    least ``saving`` of ``best``'s total there; else None."""
    cheapest = min(f[0] for f in finals)
    total = {i: float(np.sum(compute)) for _, i, compute in finals}
    near = [i for cost, i, _ in finals if cost <= cheapest * (1 + margin)]
    lean = min(near, key=lambda i: (total[i], i))
    return lean if lean != best and saves_enough(total[lean], total[best], saving) else None


def saves_enough(total: float, than: float, saving: float = DEFAULT_CONFIG.lean_saving) -> bool:
    """Whether a plan's measured ``total`` compute saves at least ``saving`` of ``than``, the
    chosen plan's total in the same run (the one rule for the lean and the least-work plans)."""
    return total <= (1 - saving) * than


def work_priced(cost: float, total: float, least: float, allowance: float | None = DEFAULT_CONFIG.work_allowance
                ) -> float:
    """``cost`` (a plan's measured cost, ms) priced for its total work: scaled by how far its
    devices' measured ``total`` compute exceeds ``1 + allowance`` times the ``least`` total of
    the plans timed with it (unchanged within that; ``allowance`` None: never scaled)."""
    if allowance is None or least <= 0:
        return cost
    return cost * max(1.0, total / (least * (1 + allowance)))


def less_work_wins(plans: list[tuple[float, int, float]], margin: float = DEFAULT_CONFIG.tie_margin,
                   allowance: float | None = DEFAULT_CONFIG.work_allowance, others: tuple[float, ...] = ()) -> int:
    """The index of the plan chosen among ``plans`` (``(measured cost, index, measured total
    compute)``, timed together): each cost priced for its work (``work_priced`` against the
    least total of ``plans`` and of ``others``, the totals of plans timed with them that may
    not be chosen), then of those whose priced cost is within ``margin`` of the cheapest (a tie
    within the instrument's noise), the one of least total compute; remaining ties go to the
    cheaper, then to the lower index."""
    least = min([t for _, _, t in plans] + list(others))
    priced = [(work_priced(cost, total, least, allowance), i, total) for cost, i, total in plans]
    cheapest = min(cost for cost, _, _ in priced)
    tied = [p for p in priced if p[0] <= cheapest * (1 + margin)]
    return min(tied, key=lambda p: (p[2], p[0], p[1]))[1]


def measured_choice(named: list[tuple[str, Plan]], tables: TableSet, calibration: Any, models: Any,
                    passes: int = DEFAULT_CONFIG.compare_passes, repeats: int = DEFAULT_CONFIG.compare_repeats,
                    runs: int = DEFAULT_CONFIG.final_check_runs, tie_margin: float = 0.0,
                    allowance: float | None = DEFAULT_CONFIG.work_allowance) -> tuple[int, list[float], list[float]]:
    """Which of ``named``'s plans ((name, plan)) measures cheapest here, each plan's measured
    cost (ms) and its devices' total compute (ms): every device of every plan timed together
    in ``runs`` interleaved runs (``measure``'s protocol), each device's mean over the runs,
    communication modelled (``plan_timing.measured_cost``). Costs within ``tie_margin`` of the
    cheapest tie and the least total compute wins (``less_work_wins``, work priced by
    ``allowance``); with 0, an exact tie goes to the first. Raises ``NeuroShardError`` when the
    plans cannot be timed now (e.g. no memory for them)."""
    costs, means, _ = timed_together([plan for _, plan in named], tables, calibration, models, passes, repeats, runs)
    totals = [float(np.sum(m)) for m in means]
    if tie_margin <= 0:
        return min(range(len(named)), key=lambda k: (costs[k], k)), costs, totals
    return (less_work_wins([(c, k, t) for k, (c, t) in enumerate(zip(costs, totals))], tie_margin, allowance),
            costs, totals)


def final_check(started: Plan, polished: Plan, tables: TableSet, calibration: Any, models: Any,
                passes: int = DEFAULT_CONFIG.compare_passes, repeats: int = DEFAULT_CONFIG.compare_repeats,
                runs: int = DEFAULT_CONFIG.final_check_runs) -> tuple[Plan, dict]:
    """The plan polish writes, and its record: ``polished`` and ``started`` (the plan polish
    started from) measured together (``measured_choice``), and ``polished`` only when its
    measured cost is lower. Each change was judged on its two devices alone, the others
    scaled by those two's drift, so kept changes can add up to a plan no faster. When the
    plans cannot be timed now (e.g. no memory), ``polished`` stays, as before this check."""
    try:
        best, (before, after), _ = measured_choice([("started", started), ("polished", polished)], tables,
                                                   calibration, models, passes, repeats, runs)
    except NeuroShardError as exc:
        log.warning("polish: the final check could not be timed: %s", exc)
        return polished, {"stopped": str(exc).splitlines()[0]}
    kept = best == 1
    if not kept:
        log.info("polish: the polished plan measured %.2f ms against %.2f for the plan it started from, "
                 "timed together; keeping the plan it started from", after, before)
    return (polished if kept else started), {"runs": runs, "started_cost_ms": round(before, 4),
                                             "polished_cost_ms": round(after, 4), "kept": kept}


__all__ = ["Choice", "compare_plans", "within_budget", "pick_finalists", "lean_candidate", "saves_enough", "work_priced",
           "less_work_wins", "measured_choice", "final_check"]
