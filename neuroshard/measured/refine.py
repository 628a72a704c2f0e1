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
every round, plan and step.

Within a budget (``measured.budget``: ``search --refine`` and ``neuroshard.shard(refine=...)`` give
300 s up to 8 devices, calibration included) the stages keep this order in time, but each runs only
when its estimate fits beside the stages worth more per second (``RefineConfig.stage_priority``,
docs/decisions.md#refine-budget): the comparison, the first rebalance round, calibration, polish,
measured-greedy, the lean plan, later rebalance rounds, the finalists' extra runs, and last the
fine-tuned rounds. The plain search's plan is there before anything is timed: it is written when
nothing fits, and the best plan measured so far when the loop is stopped (Ctrl-C, SIGTERM).
"""
from __future__ import annotations

from typing import Any

from ..constants import CALIBRATION_SETS
from ..plan import Plan
from ..search.api import search_plan
from ..search.registry import get_trait
from ..tables import TableSet
from .budget import Budget, stop_reason
from .candidates import COMPARE, HOW_KEPT, PRETRAINED_SUFFIX, other_plans, timed_entries
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
           rebalance_plans: bool = True, config: RefineConfig = DEFAULT_CONFIG, budget: Budget | None = None,
           fallback: Plan | None = None, **search_options: Any) -> Plan:
    """Search ``rounds + 1`` plans (None: ``config.rounds``), each against models fine-tuned on the
    devices of the plans before it (``measured.rounds``; each timed in ``timing_passes`` passes, None:
    ``config.refine_passes``), time them with the plans of the ``compare`` algorithms
    (``measured.candidates``), and return the one measured cheapest (``measured.choice``), rebalanced
    when that measures cheaper (with ``rebalance_plans``: ``measured.rebalance``) and polished
    (``measured.polish``; ``polish_steps`` defaults to ``default_polish_steps(devices)``).
    ``calibration`` is a ``Calibration`` with its random sets measured (``start_calibration``);
    ``models``: what ``calibration.fit()`` gave, when already fitted. ``search_options`` go to
    ``search.api.search_plan`` (only ``candidates.PLAN_OPTIONS`` of them for the compared algorithms).
    ``judge`` (a ``measured.judge.PlanJudge``) makes the final choice among the polished plan and
    every distinct plan timed (``final_judgement``). ``config``: the tuned constants.

    ``budget`` (``measured.budget.Budget``, started where the loop started): every stage within it,
    skipped or cut short when its estimate does not fit (the stages' modules say how); none: every
    stage runs in full. ``fallback``: the plain search's plan against the pre-trained models (searched
    here when None), written when nothing could be timed. On Ctrl-C (``KeyboardInterrupt``) or SIGTERM
    (``budget.Terminated``) the best plan measured so far comes back, ``provenance.refine.stopped``
    saying so. ``provenance.refine`` records every round, plan and step, and the budget's fields
    (``Budget.record``: the budget, the whole wall time, each stage's seconds, what was skipped)."""
    rounds = check_refine(algorithm, True if rounds is None else rounds, config.rounds)
    timing_passes = config.refine_passes if timing_passes is None else timing_passes
    if budget is not None:
        calibration.budget = budget
        budget.learn(calibration.timing_seconds, calibration.timed_units)
        expect_stages(budget, len(tables), devices, rounds, compare, config)
    loop = _Loop(tables, devices, memory, calibration, algorithm, config, budget, search_options)
    try:
        loop.run(rounds, timing_passes, models, compare, polish_steps, judge, rebalance_plans, fallback)
    except KeyboardInterrupt as exc:
        if loop.budget.best_plan is None:
            raise  # stopped in the plain search itself: nothing to write
        loop.budget.stop(stop_reason(exc))
    finally:
        loop.budget.progress.close()
    return loop.written()


def expect_stages(budget: Budget, tables: int, devices: int, rounds: int, compare: tuple[str, ...],
                  config: RefineConfig = DEFAULT_CONFIG) -> None:
    """Tell ``budget`` what each stage of refine will cost (``Budget.expect``; the estimates follow
    the timing rate measured as the loop runs), for a task of ``tables`` tables on ``devices``."""
    runs, d = config.final_check_runs, devices

    def t(sets: int, passes: int | None = None, repeat: int = 1) -> float:
        return budget.timing_s(sets, passes, repeat)

    polish_s = lambda: t(4 * config.budget_polish_steps, repeat=2) + t(2 * d, repeat=runs)  # noqa: E731
    budget.expect("compare", lambda: t(config.budget_compare_plans * d))
    budget.expect("rebalance", lambda: t((config.budget_rebalance_plans + 2) * d, repeat=runs) + t(3 * d, repeat=runs))
    budget.expect("polish", polish_s)
    budget.expect("lean", lambda: polish_s() + t(2 * d, repeat=runs))
    budget.expect("rebalance-more", lambda: t((config.budget_rebalance_plans + 1) * d, repeat=runs))
    budget.expect("finalists", lambda: t(config.min_finalists * d, repeat=config.finalist_runs - 1))
    if rounds:
        budget.expect("rounds", lambda: rounds * (budget.fine_tune_s(tables + CALIBRATION_SETS) +
                                                  t(d, config.refine_passes)))
    if any(get_trait(name, "needs_hardware") for name in compare):
        budget.expect("measured-greedy", lambda: t(tables, 1))


class _Loop:
    """One refine under way: its plans, their records, the plan chosen so far, and the budget
    (``staged``: what the stages are given, None without a budget)."""

    def __init__(self, tables: TableSet, devices: int, memory: Any, calibration: Any, algorithm: str,
                 config: RefineConfig, budget: Budget | None, search_options: dict) -> None:
        self.tables, self.devices, self.memory, self.calibration = tables, devices, memory, calibration
        self.algorithm, self.config, self.options = algorithm, config, search_options
        self.budget, self.staged = (budget or Budget(None, config=config)), budget
        self.history: list[dict] = []
        self.plans: list[Plan] = []
        self.entries: list[dict] = []
        self.compare: tuple[str, ...] = ()
        self.chosen: Plan | None = None
        self.fallback: Plan | None = None
        self.against: dict | None = None  # the best plan so far against the best baseline: name and ratio
        self.polished = False  # the plan chosen was polished
        self.record: dict = {"rounds": [], "chosen_round": None, "chosen": f"{algorithm}{PRETRAINED_SUFFIX}",
                             "compared": [], "timing_passes": config.refine_passes,
                             "compare_timing": {"passes": config.compare_passes, "repeats": config.compare_repeats,
                                                "statistic": calibration.config.get("figure", "fastest")},
                             "batch_size": calibration.models.batch_size,
                             "hardware": calibration.config.get("hardware", "")}

    def name(self, i: int) -> str:
        return self.entries[i]["algorithm"] if round_of(i, self.history) is None else f"round {i}"

    def keep(self, plan: Plan, name: str) -> None:
        ratio = None if self.against is None else self.against["ratio"]
        self.budget.keep(plan, name, ratio, None if self.against is None else self.against["baseline"])

    def run(self, rounds: int, timing_passes: int, models: Any, compare: tuple[str, ...], polish_steps: int | None,
            judge: PlanJudge | None, rebalance_plans: bool, fallback: Plan | None) -> None:
        budget, staged, record, config = self.budget, self.staged, self.record, self.config
        self.compare, record["timing_passes"] = compare, timing_passes
        if fallback is None:
            with budget.stage("search"):
                fallback = search_plan(self.tables, self.devices, self.memory, algorithm=self.algorithm,
                                       cost_models=self.calibration.models, **self.options)
        self.fallback = fallback
        if budget.best_plan is None:
            budget.keep(fallback, f"{self.algorithm}{PRETRAINED_SUFFIX}")
        with budget.stage("rounds"):
            self.history, self.plans, models = search_rounds(self.tables, self.devices, self.memory, self.calibration,
                                                             models, rounds, timing_passes, self.algorithm,
                                                             self.options, staged)
        record["rounds"] = self.history
        with budget.stage("candidates"):
            others, record["compared"] = other_plans(self.tables, self.devices, self.memory, self.calibration, models,
                                                     self.algorithm, compare, self.options, staged, fallback)
        self.plans += others
        self.entries = self.history + timed_entries(record["compared"])  # one per plan, in order
        with budget.stage("compare"):
            choice = compare_plans(self.plans, self.entries, self.tables, self.calibration, models, config, staged,
                                   len(self.history), lambda i: self.keep(self.plans[i], self.name(i)))
        if choice is None:  # nothing timed: the plain search's plan is written
            if judge is not None:
                record["judge"] = {"judge": judge.describe(), "skipped": "nothing timed within the budget"}
            return
        best = self.chose(choice)
        for stage, coming in (("lean", choice.lean is not None), ("rebalance", rebalance_plans),
                              ("rebalance-more", rebalance_plans), ("finalists", False)):
            if not coming:  # it holds no time against the stages after it
                budget.expected.pop(stage, None)
        if rebalance_plans:
            with budget.stage("rebalance"):
                best = self.rebalance(choice, best, models)
        with budget.stage("polish"):
            self.polish(choice, best, models, polish_steps)
        if judge is not None:
            self.judge(judge)

    def chose(self, choice: Any) -> int:
        """The comparison's choice recorded (a tie; the best plan so far against the best baseline)."""
        record, best = self.record, choice.best
        record.update(chosen_round=round_of(best, self.history), chosen=self.name(best))
        if best != choice.cheapest:  # a tie on the slowest device, or the price of work, went to less total work
            record["tie"] = {"margin": self.config.tie_margin, "work_allowance": self.config.work_allowance,
                             "cheapest": self.name(choice.cheapest), "chosen": self.name(best)}
        baselines = [(e["final_measured_cost_ms"], e["algorithm"]) for e in self.entries
                     if e.get("algorithm") in self.compare and "final_measured_cost_ms" in e]
        if baselines:  # in the comparison run: every plan timed together
            cost, name = min(baselines)
            self.against = {"baseline": name, "ratio": self.entries[best]["final_measured_cost_ms"] / cost}
        self.chosen = self.plans[best]
        self.keep(self.chosen, self.name(best))
        return best

    def scale(self, factor: float) -> None:
        """The best plan so far changed, measured ``factor`` x the plan it came from."""
        if self.against is not None:
            self.against["ratio"] *= factor

    def rebalance(self, choice: Any, best: int, models: Any) -> int:
        record, plans, config = self.record, self.plans, self.config
        starts = rebalance_starts(choice, config.lean_saving)
        kept, origin, choice.compute, record["rebalance"] = rebalance_chosen(
            plans, self.entries, starts, choice, self.tables, self.calibration, models,
            [self.name(i) for i in starts], self.options.get("row_blocks"), self.name(choice.least_work), config,
            self.staged)
        if kept != best:
            confirm = record["rebalance"].get("confirm", {})
            if "measured_cost_ms" in confirm:
                self.scale(confirm["measured_cost_ms"][1] / confirm["measured_cost_ms"][0])
            choice.lean = None if origin == choice.lean else choice.lean
            record.update(chosen=self.name(kept), chosen_round=None)
            self.chosen = plans[kept]
            self.keep(self.chosen, self.name(kept))
        return kept

    def polish(self, choice: Any, best: int, models: Any, polish_steps: int | None) -> None:
        if polish_steps is None:
            polish_steps = default_polish_steps(self.devices, self.config)
        chosen, start = polish_and_lean(self.plans, best, choice.lean, choice.compute, choice, polish_steps,
                                        self.options.get("row_blocks"), self.tables, self.calibration, models,
                                        self.record, self.name, self.history, self.config, self.staged)
        check = self.record.get("polish", {}).get("final_check", {})
        if check.get("kept"):
            self.scale(check["polished_cost_ms"] / check["started_cost_ms"])
        lean = self.record.get("lean", {})
        if lean.get("kept"):
            self.scale(lean["measured_cost_ms"][1] / lean["measured_cost_ms"][0])
        self.polished = chosen is not self.plans[start]
        self.chosen = chosen
        self.keep(chosen, self.record["chosen"] + (", polished" if self.polished else ""))

    def judge(self, judge: PlanJudge) -> None:
        budget, record = self.budget, self.record
        named = [(self.name(i), p) for i, p in enumerate(self.plans)]
        ours = record["chosen"] + (", polished" if self.polished else "")
        if self.staged is not None:
            distinct = len({p.layout_key() for p in [self.chosen, *self.plans]})
            cost = distinct * getattr(judge, "runs", 1) * self.config.judge_plan_run_s
            if not budget.fits("judge", cost):
                why = budget.out_of_time("judge", f"the {judge.name} judge's runs of {distinct} plans", cost)
                budget.skip("judge", why + "; the kernel's choice written")
                record["judge"] = {"judge": judge.describe(), "skipped": why}
                return
            budget.say(f"the {judge.name} judge: {distinct} plans")
        with budget.stage("judge"):
            self.chosen, record["judge"] = final_judgement([(ours, self.chosen), *named], self.tables, judge)
        record["chosen"] = record["judge"].get("chosen", record["chosen"])
        self.keep(self.chosen, record["chosen"])

    def written(self) -> Plan:
        """The plan refine returns, its ``provenance.refine`` filled in: the loop's choice, or when it
        stopped before its end the best plan measured so far (the plain search's before any)."""
        budget, record = self.budget, self.record
        plan = self.chosen if self.chosen is not None and not budget.stopped else budget.best_plan
        if plan is None:
            plan = self.fallback
        if budget.stopped:
            record["chosen"] = budget.best_name
        record["hardware"] = self.calibration.config.get("hardware", "")
        if self.against is not None:
            record["against_best_baseline"] = {"baseline": self.against["baseline"],
                                               "ratio": round(self.against["ratio"], 4)}
        record.update(budget.record())
        plan.provenance["refine"] = record
        return plan


__all__ = ["refine", "expect_stages", "RefineConfig", "DEFAULT_CONFIG", "polish", "final_check", "measured_choice",
           "final_judgement", "format_judgement", "default_polish_steps", "check_refine", "work_priced", "saves_enough", "HOW_KEPT",
           "DEFAULT_ROUNDS"]
