"""Measured refinement: refine's stages, composed.

``refine`` continues a calibration (``measured.calibrate``: the task's tables and random
device-sized sets, timed on this machine) with these stages, one module each, read in order:

1. ``measured.rounds``: search a plan, time its devices here, fine-tune the models on them; again.
2. ``measured.candidates``: the other plans timed with the rounds': the same search against the
   pre-trained models and against the work model alone, and the baselines' plans.
3. ``measured.choice``: every plan timed together, the finalists again; ties and work priced.
4. ``measured.rebalance``: plans rebalanced, repacked and split by marginal costs fitted to
   those runs, timed against the plan chosen and confirmed in fresh runs.
5. ``measured.polish``: measured steps off the slowest device of the chosen plan and of the
   lean plan, the two then timed together.
6. ``measured.judge``: with a judge, whole plans measured another way have the last word.

``measured.config.RefineConfig`` holds every tuned constant (and the words run, pass, repeat,
round); ``measured.plan_timing`` times whole plans. Provenance (``provenance.refine``) records
every round, plan and step. A round costs one search, ``D`` timed device sets and one
fine-tuning: about a minute for 8 devices on 2 CPU cores.
"""
from __future__ import annotations

from typing import Any

from ..plan import Plan
from ..tables import TableSet
from .candidates import COMPARE, HOW_KEPT, other_plans
from .choice import (
    compare_plans,
    final_check,
    lean_candidate,
    less_work_wins,
    measured_choice,
    pick_finalists,
    saves_enough,
    work_priced,
)
from .config import DEFAULT_CONFIG, RefineConfig
from .judge import PlanJudge, final_judgement, format_judgement
from .plan_timing import time_plans
from .polish import default_polish_steps, polish, polish_and_lean
from .rebalance import rebalance_chosen, rebalance_starts
from .rounds import check_refine, round_of, search_rounds

#: the default configuration's constants by their names (``RefineConfig`` holds them; other modules import these)
DEFAULT_ROUNDS = DEFAULT_CONFIG.rounds
REFINE_PASSES = DEFAULT_CONFIG.refine_passes
COMPARE_PASSES = DEFAULT_CONFIG.compare_passes
COMPARE_REPEATS = DEFAULT_CONFIG.compare_repeats
FINAL_CHECK_RUNS = DEFAULT_CONFIG.final_check_runs
FINALIST_RUNS = DEFAULT_CONFIG.finalist_runs
FINALIST_MARGIN = DEFAULT_CONFIG.finalist_margin
MIN_FINALISTS = DEFAULT_CONFIG.min_finalists
MAX_FINALISTS = DEFAULT_CONFIG.max_finalists
TIE_MARGIN = DEFAULT_CONFIG.tie_margin
WORK_ALLOWANCE = DEFAULT_CONFIG.work_allowance
LEAN_MARGIN = DEFAULT_CONFIG.lean_margin
LEAN_SAVING = DEFAULT_CONFIG.lean_saving
POLISH_STEPS = DEFAULT_CONFIG.polish_steps
REBALANCE_ROUNDS = DEFAULT_CONFIG.rebalance_rounds
SPLIT_REPACK_VARIANTS = DEFAULT_CONFIG.split_repack_variants
#: the stages' rules by the names they had as parts of this module
_finalists, _lean, _less_work_wins, _time_plans = pick_finalists, lean_candidate, less_work_wins, time_plans


def refine(tables: TableSet, devices: int, memory: Any, calibration: Any, rounds: int | None = None,
           timing_passes: int | None = None, algorithm: str = "neuroshard", models: Any = None,
           polish_steps: int | None = None, compare: tuple[str, ...] = COMPARE, judge: PlanJudge | None = None,
           rebalance_plans: bool = True, config: RefineConfig = DEFAULT_CONFIG, **search_options: Any) -> Plan:
    """Search ``rounds + 1`` plans (None: ``config.rounds``), each against models fine-tuned on the
    devices of the plans before it (``measured.rounds``; each timed in ``timing_passes`` passes, None:
    ``config.refine_passes``), time them with the plans of the ``compare`` algorithms
    (``measured.candidates``), and return the one measured cheapest (``measured.choice``), rebalanced
    when that measures cheaper (with ``rebalance_plans``: ``measured.rebalance``) and polished
    (``measured.polish``; ``polish_steps`` defaults to ``default_polish_steps(devices)``).
    ``calibration`` is a ``Calibration`` with its random sets measured (``start_calibration``);
    ``models``: what ``calibration.fit()`` gave, when already fitted. ``search_options`` go to
    ``search.api.shard`` (only ``candidates.PLAN_OPTIONS`` of them for the compared algorithms).
    ``judge`` (a ``measured.judge.PlanJudge``) makes the final choice among the polished plan and
    every distinct plan timed (``final_judgement``). ``config``: the tuned constants."""
    rounds = check_refine(algorithm, True if rounds is None else rounds, config.rounds)
    timing_passes = config.refine_passes if timing_passes is None else timing_passes
    history, plans, models = search_rounds(tables, devices, memory, calibration, models, rounds, timing_passes,
                                           algorithm, search_options)
    others, compared = other_plans(tables, devices, memory, calibration, models, algorithm, compare, search_options)
    plans += others
    entries = history + [c for c in compared if "failed" not in c]  # one per plan, in order
    choice = compare_plans(plans, entries, tables, calibration, models, config)
    best, lean = choice.best, choice.lean

    def name(i: int) -> str:
        return entries[i]["algorithm"] if round_of(i, history) is None else f"round {i}"

    record = {"rounds": history, "chosen_round": round_of(best, history),
              "chosen": name(best), "compared": compared, "timing_passes": timing_passes,
              "compare_timing": {"passes": config.compare_passes, "repeats": config.compare_repeats,
                                 "statistic": calibration.config.get("figure", "fastest")},
              "batch_size": calibration.models.batch_size,
              "hardware": calibration.config.get("hardware", "")}
    if best != choice.cheapest:  # a tie on the slowest device, or the price of work, went to less total work
        record["tie"] = {"margin": config.tie_margin, "work_allowance": config.work_allowance,
                         "cheapest": name(choice.cheapest), "chosen": name(best)}
    compute = choice.compute
    if rebalance_plans:
        starts = rebalance_starts(choice, config.lean_saving)
        kept, origin, compute, record["rebalance"] = rebalance_chosen(
            plans, entries, starts, choice, tables, calibration, models, [name(i) for i in starts],
            search_options.get("row_blocks"), name(choice.least_work), config)
        if kept != best:
            best, lean = kept, (None if origin == lean else lean)
            record.update(chosen=name(best), chosen_round=None)
    if polish_steps is None:
        polish_steps = default_polish_steps(devices, config)
    chosen, start = polish_and_lean(plans, best, lean, compute, choice, polish_steps, search_options.get("row_blocks"),
                                    tables, calibration, models, record, name, history, config)
    if judge is not None:
        named = [(name(i), p) for i, p in enumerate(plans)]
        ours = record["chosen"] + ("" if chosen is plans[start] else ", polished")
        chosen, record["judge"] = final_judgement([(ours, chosen), *named], tables, judge)
        record["chosen"] = record["judge"].get("chosen", record["chosen"])
    chosen.provenance["refine"] = record
    return chosen


__all__ = ["refine", "RefineConfig", "DEFAULT_CONFIG", "polish", "final_check", "measured_choice", "final_judgement",
           "format_judgement", "default_polish_steps", "check_refine", "work_priced", "saves_enough", "HOW_KEPT",
           "DEFAULT_ROUNDS"]
