"""Refine's rebalance stage: plans made from the timed ones, timed against the plan chosen.

The comparison and finalist runs have timed every device of ~10 plans of the task's own tables.
Marginal costs fitted to those devices (``measured.marginal``) estimate what a change costs, so
the plan chosen, the lean plan and the plan of least total work are changed offline: whole pieces
moved off the slowest device (``measured.rebalance_walk``), whole tables placed afresh, the
hottest table cut into row blocks (``measured.repack``). The new plans are timed together with
the plan kept so far, the cheapest goes on (``measured.choice``'s rules), for up to
``rebalance_rounds`` rounds; the plan the rounds kept is then confirmed in fresh runs beside the
plan chosen before (docs/decisions.md#rebalance). Polish's single steps are guided by the models
and measured one at a time; rebalancing makes many changes at once, guided by what was measured,
and one timing decides.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import NeuroShardError
from ..plan import Plan
from ..search.simulator import Simulator
from ..tables import TableSet
from .candidates import REBALANCED, REPACKED, REPACKED_EVEN, SPLIT, SPLIT_REPACKED
from .choice import Choice, less_work_wins, saves_enough
from .config import DEFAULT_CONFIG, RefineConfig
from .marginal import MarginalCosts, anchor_weight, fit_marginal_costs, run_noise_var
from .plan_timing import timed_together
from .rebalance_walk import rebalance, rebalance_cuts, whole_rows
from .repack import repack, split_hot

log = logging.getLogger("neuroshard.measured.refine")  # the loop's stages log as refine

#: the default configuration's rebalance constants, by their names (``RefineConfig`` holds them)
MARGINAL_RIDGE = DEFAULT_CONFIG.marginal_ridge
REBALANCE_MIN_GAIN = DEFAULT_CONFIG.rebalance_min_gain
REBALANCE_SHORT = DEFAULT_CONFIG.rebalance_short
EVEN_SLACK = DEFAULT_CONFIG.even_slack


def rebalance_starts(choice: Choice, saving: float = DEFAULT_CONFIG.lean_saving) -> list[int]:
    """The plans the rebalance starts from: the plan chosen, the lean plan, and the plan whose devices did
    the least total work in the comparison run (whatever its cost there: its hottest table cut and the rest
    repacked is often balanced at about that work) when it saves ``saving`` of the chosen plan's."""
    best, lean, least = choice.best, choice.lean, choice.least_work
    saves = saves_enough(float(np.sum(choice.first[least])), float(np.sum(choice.first[best])), saving)
    return list(dict.fromkeys([best] + ([lean] if lean is not None else []) + ([least] if saves else [])))


class _Evidence:
    """Every device timed so far (``sets``, ``times``: what the marginal costs are fitted to) and each
    plan's devices in every run it was timed in (``repeats``: the noise of one run)."""

    def __init__(self, calibration: Any, plans: list[Plan], timed: list):
        self.calibration = calibration
        self.sets: list = []
        self.times: list = []
        for run in timed:
            self.add(run, plans)
        # the noise of one run, from the plans timed in more than one (the finalists, then each round's plans):
        # what each rebalance's anchor is shrunk by (measured.marginal.anchor_weight)
        by_plan: dict[int, list[np.ndarray]] = {}
        for run in timed:
            for _, i, comp in run:
                by_plan.setdefault(i, []).append(comp)
        self.repeats = [np.array(times) for times in by_plan.values()]
        self.runs_of = {i: len(times) for i, times in by_plan.items()}

    def add(self, run: list, of: list[Plan]) -> None:
        """A timing run's devices (``(cost, index into of, compute)`` per plan) join the fit."""
        for _, i, comp in run:
            for s, t in zip(self.calibration.sim.device_sets(of[i]), comp):
                if s:
                    self.sets.append(s)
                    self.times.append(t)


@dataclass
class _Rebalancing:
    """One rebalance stage: what it times with, its evidence and its record
    (formats: ``provenance.refine.rebalance``)."""

    plans: list[Plan]
    tables: TableSet
    calibration: Any
    models: Any
    config: RefineConfig
    row_blocks: str | None
    reference: int | None
    reference_name: str
    evidence: _Evidence
    record: dict = field(default_factory=lambda: {"plans": [], "kept": None})
    budget: Any = None

    def __post_init__(self) -> None:
        self.known = {p.layout_key() for p in self.plans}

    def alone(self, pieces: list) -> np.ndarray:
        return self.calibration.predict([[p] for p in pieces], self.models)

    def fit(self) -> tuple[MarginalCosts, float | None]:
        """Marginal costs fitted to every device timed so far, and the noise of one run."""
        costs = fit_marginal_costs(self.evidence.sets, np.array(self.evidence.times), self.alone, len(self.tables),
                                   self.config.marginal_ridge, self.config.factor_range)
        noise = run_noise_var(self.evidence.repeats)
        self.record["fit"] = costs.to_dict()
        if noise is not None:
            self.record["fit"]["run_noise"] = round(float(np.sqrt(noise)), 4)
        return costs, noise

    def candidates(self, round_: int, froms: list[tuple], costs: MarginalCosts, noise: float | None) -> list[tuple]:
        """(start index, plan, its record, how the plan kept is named) of each new plan of a round made from
        ``froms`` (start index, its name, plan, its devices' times, how many runs those aggregate): each
        start rebalanced (and cut after ``rebalance_short`` changes when longer: the estimate errs with their
        number); in round 1 also each start's dearest table of its slowest device cut into row blocks, the rest
        as it is and placed afresh in ``split_repack_variants`` packings, and the first start's whole tables
        placed afresh by the fit, as they come and evenly."""
        config, batch = self.config, self.calibration.models.batch_size
        walk = {"min_gain": config.rebalance_min_gain, "steps_per_device": config.rebalance_steps_per_device}
        candidates = []
        for k, (i, label, plan, ms, runs_in) in enumerate(froms):
            sim = Simulator.from_plan(plan, self.models, self.tables, batch)
            tries = [(moved, info, REBALANCED) for moved, info in
                     rebalance_cuts(plan, ms, costs, sim, self.alone, (config.rebalance_short,), **walk,
                                    noise_var=noise, runs=runs_in)]
            if round_ == 1:
                tries.append((*split_hot(plan, ms, costs, sim, self.alone, **walk, noise_var=noise, runs=runs_in,
                                         row_blocks=self.row_blocks), SPLIT))
                tries += [(*split_hot(plan, ms, costs, sim, self.alone, **walk, noise_var=noise, runs=runs_in,
                                      row_blocks=self.row_blocks, repack=True, variant=v,
                                      spread=config.split_repack_spread), SPLIT_REPACKED)
                          for v in range(config.split_repack_variants)]
            if k == 0 and round_ == 1:
                tries.append((*repack(plan, costs, sim, self.alone, **walk, even_slack=config.even_slack), REPACKED))
                tries.append((*repack(plan, costs, sim, self.alone, **walk, even=True, even_slack=config.even_slack),
                              REPACKED_EVEN))
            for moved, info, suffix in tries:
                self.record["plans"].append({"round": round_, "from": label, **info})
                if moved is not None and moved.layout_key() not in self.known:
                    self.known.add(moved.layout_key())
                    candidates.append((i, moved, self.record["plans"][-1], suffix))
        return candidates

    def reference_to(self, timed: Plan) -> list[Plan]:
        """``[plans[reference]]``, the plan of least work timed beside the rebalance's plans, unless there
        is none or it is the same layout as ``timed`` (timed already)."""
        if self.reference is None or self.plans[self.reference].layout_key() == timed.layout_key():
            return []
        return [self.plans[self.reference]]

    def timed(self, which: list[Plan]) -> tuple[list[float], list[np.ndarray], list]:
        config = self.config
        return timed_together(which, self.tables, self.calibration, self.models, config.compare_passes,
                              config.compare_repeats, config.final_check_runs)

    def time_round(self, round_: int, kept_plan: Plan, kept_label: str, candidates: list[tuple]) -> tuple | None:
        """A round's ``candidates`` timed together with ``kept_plan`` (and the least-work plan, never kept
        here: the least total that work is priced against), their figures recorded. Returns the index in
        ``[kept_plan, *candidates]`` of the one kept, the devices' means and the runs; None when they
        cannot be timed now (e.g. no memory)."""
        which = [kept_plan] + [c[1] for c in candidates] + self.reference_to(kept_plan)
        try:
            cost, means, runs = self.timed(which)
        except NeuroShardError as exc:  # e.g. no memory to time them now: the plan kept so far stays
            self.record["stopped"] = str(exc).splitlines()[0]
            return None
        for run in runs:
            self.evidence.add(run, which)
        self.evidence.repeats += [np.array([run[k][2] for run in runs]) for k in range(len(which))]
        totals = [float(np.sum(m)) for m in means]
        chosen_from = len(candidates) + 1  # the reference (when timed) is last, and never kept here
        referenced = len(which) > chosen_from
        if referenced:
            self.record["reference"] = self.reference_name
        for k, (_, _, info, _) in enumerate(candidates, start=1):
            info["measured_cost_ms"], info["against_ms"] = round(cost[k], 4), round(cost[0], 4)
            info["measured_total_compute_ms"] = round(totals[k], 4)
            info["against_total_compute_ms"] = round(totals[0], 4)
            if referenced:
                info["reference_total_compute_ms"] = round(totals[-1], 4)
        if round_ == 1:
            self.record["chosen_measured_cost_ms"] = round(cost[0], 4)
            self.record["chosen_measured_total_compute_ms"] = round(totals[0], 4)
        # a tie on the slowest device (within tie_margin) goes to less total work, as among the finalists, and
        # total work beyond work_allowance over the run's least is priced
        k = less_work_wins([(cost[c], c, totals[c]) for c in range(chosen_from)], self.config.tie_margin,
                           self.config.work_allowance, others=tuple(totals[chosen_from:]))
        log.info("refine: rebalance round %d: %s ms against %.2f for %s", round_,
                 ", ".join(f"{c:.2f}" for c in cost[1:chosen_from]), cost[0], kept_label)
        return k, means, runs

    def run_s(self, plans: int) -> float:
        """The estimated seconds of timing ``plans`` plans (and the least-work reference) together."""
        devices = self.plans[0].num_devices
        return self.budget.timing_s((plans + 1) * devices, self.config.compare_passes, self.config.final_check_runs)

    def within_budget(self, round_: int, candidates: list[tuple], kept_plan: Plan) -> list[tuple]:
        """The ``candidates`` a round times within the budget (all without one): as many as fit with the plan
        kept so far, leaving the confirmation's runs, those whose estimate drops most first; the others are
        recorded as skipped."""
        if self.budget is None or not candidates:
            return candidates
        confirm = self.run_s(2)
        worth = "rebalance" if round_ == 1 else "rebalance-more"  # later rounds gained less per second
        fit = max((k for k in range(len(candidates) + 1) if self.budget.fits(worth, self.run_s(k + 1) + confirm)),
                  default=0)
        if fit >= len(candidates):
            self.budget.say(f"round {round_}: timing {len(candidates)} rebalanced plans", round_,
                            self.config.rebalance_rounds)
            return candidates
        why = self.budget.out_of_time(worth, f"round {round_}'s {len(candidates)} plans",
                                      self.run_s(len(candidates) + 1) + confirm)
        ranked = sorted(candidates, key=lambda c: c[2]["estimated_cost_after_ms"]
                        / max(c[2]["estimated_cost_before_ms"], 1e-9))[:fit]
        self.budget.skip(worth, f"{len(candidates) - fit} of round {round_}'s plans ({why}; the {fit} "
                                f"estimated to gain most timed)" if fit else
                         f"rounds {round_}-{self.config.rebalance_rounds} ({why})")
        for c in candidates:
            if not any(c is k for k in ranked):
                c[2]["skipped"] = "not timed: the budget"
        return [c for c in candidates if any(c is k for k in ranked)]

    def confirm(self, chosen: Plan, kept_plan: Plan, kept_label: str) -> tuple[bool, list[np.ndarray] | None]:
        """The rounds kept the cheapest of several plans in the runs that chose it: part of its lead there is
        those runs' noise (the winner's curse). Fresh runs of it beside ``chosen`` (the plan chosen before)
        confirm it, by the same rule. Returns whether it stays, and the devices' means of (chosen, kept)
        (None when they could not be timed now: the rounds' choice stays). With a budget that no longer
        fits them, it does not stay (unconfirmed)."""
        if self.budget is not None and not self.budget.fits("rebalance", self.run_s(2)):
            why = self.budget.out_of_time("rebalance", "the confirmation", self.run_s(2))
            self.budget.skip("rebalance", f"the confirmation of {kept_label} ({why}); the chosen plan stays")
            self.record["confirm"] = {"skipped": why}
            return False, None
        if self.budget is not None:
            self.budget.say(f"confirming {kept_label} in fresh runs")
        try:
            cost, means, _ = self.timed([chosen, kept_plan] + self.reference_to(chosen))
        except NeuroShardError as exc:  # e.g. no memory to time them now: the rounds' choice stays
            self.record["confirm"] = {"stopped": str(exc).splitlines()[0]}
            return True, None
        totals = [float(np.sum(m)) for m in means]
        confirmed = less_work_wins([(cost[0], 0, totals[0]), (cost[1], 1, totals[1])], self.config.tie_margin,
                                   self.config.work_allowance, others=tuple(totals[2:])) == 1
        self.record["confirm"] = {"plan": kept_label, "runs": self.config.final_check_runs,
                                  "measured_cost_ms": [round(c, 4) for c in cost[:2]],
                                  "measured_total_compute_ms": [round(t, 4) for t in totals[:2]], "kept": confirmed}
        if len(totals) > 2:
            self.record["confirm"]["reference_total_compute_ms"] = round(totals[2], 4)
        log.info("refine: rebalance confirmed in fresh runs: %s %.2f ms against %.2f for the chosen plan%s",
                 kept_label, cost[1], cost[0], "" if confirmed else "; the chosen plan stays")
        return confirmed, means


def rebalance_chosen(plans: list[Plan], entries: list[dict], starts: list[int], choice: Choice, tables: TableSet,
                     calibration: Any, models: Any, names: list[str], row_blocks: str | None = None,
                     reference_name: str = "", config: RefineConfig = DEFAULT_CONFIG, budget: Any = None
                     ) -> tuple[int, int, np.ndarray, dict]:
    """``starts[0]`` (the plan chosen, its devices measured ``choice.compute``) or a plan made from the
    ``starts`` (named ``names``; each anchored at its devices' ``choice.latest_ms``), whichever measures
    cheapest: each of up to ``rebalance_rounds`` rounds fits marginal costs to every device timed so far
    (``choice.timed``, then the rounds' own runs), makes new plans (``_Rebalancing.candidates``: in the
    first round from every start, later from the plan kept so far), times them with the plan kept so far
    (``final_check_runs`` runs, each device's mean) and keeps the cheapest (``less_work_wins``, work priced
    against the least total in the run, ``plans[choice.least_work]`` timed in every run for that); the rounds
    stop when it is the one kept before or nothing changes. The plan the rounds kept is then confirmed in
    fresh runs (``_Rebalancing.confirm``), and appended to ``plans`` and ``entries`` when it stays. Returns
    the index of the plan kept, the start it came from, its devices' measured compute, and the record.
    With a ``budget``, a round times only the plans whose runs fit beside the confirmation's
    (``_Rebalancing.within_budget``: those estimated to gain most), and a plan kept unconfirmed for want
    of time is not kept."""
    best = starts[0]
    stage = _Rebalancing(plans, tables, calibration, models, config, row_blocks, choice.least_work, reference_name,
                         _Evidence(calibration, plans, choice.timed), budget=budget)
    record = stage.record
    kept_plan, kept_ms, kept_label, origin = plans[best], choice.compute, names[0], best
    froms = [(i, label, plans[i], choice.latest_ms[i], stage.evidence.runs_of.get(i, 1))
             for i, label in zip(starts, names)]
    for round_ in range(1, config.rebalance_rounds + 1):
        costs, noise = stage.fit()
        candidates = stage.candidates(round_, froms, costs, noise)
        log.info("refine: rebalance round %d: marginal costs fitted to %d timed devices (%.1f%% off them); %d "
                 "rebalanced plan(s) to time", round_, costs.sets_, 100 * costs.fit_error_, len(candidates))
        candidates = stage.within_budget(round_, candidates, kept_plan)
        if not candidates:
            break
        timed = stage.time_round(round_, kept_plan, kept_label, candidates)
        if timed is None:
            break
        k, means, runs = timed
        if k == 0:  # the plan kept so far stays, with its devices as timed when it was chosen (or kept)
            if record["kept"] is not None:
                kept_ms = means[0]
            break
        start, kept_plan, _, suffix = candidates[k - 1]
        if round_ == 1:
            origin, kept_suffix = start, suffix
        kept_ms = means[k]
        kept_label = f"{names[starts.index(origin)]}, {kept_suffix}"
        record["kept"], record["rounds_kept"] = kept_label, round_
        froms = [(origin, kept_label, kept_plan, kept_ms, len(runs))]
    if record["kept"] is None:
        return best, best, kept_ms, record
    confirmed, means = stage.confirm(plans[best], kept_plan, kept_label)
    if not confirmed:
        record["kept"] = None
        return best, best, (choice.compute if means is None else means[0]), record
    if means is not None:
        kept_ms = means[1]
    plans.append(kept_plan)
    entries.append({"algorithm": kept_label})
    at_tables = Simulator.from_plan(kept_plan, models, tables)
    kept_plan.estimate = {**(kept_plan.estimate or {}), **at_tables.plan_estimate(at_tables.evaluate_plan(kept_plan))}
    log.info("refine: kept %s (%d rebalance rounds)", kept_label, record["rounds_kept"])
    return len(plans) - 1, origin, kept_ms, record


__all__ = ["rebalance_starts", "rebalance_chosen", "MarginalCosts", "fit_marginal_costs", "run_noise_var",
           "anchor_weight", "rebalance", "rebalance_cuts", "whole_rows", "repack", "split_hot", "MARGINAL_RIDGE",
           "REBALANCE_MIN_GAIN", "REBALANCE_SHORT", "EVEN_SLACK"]
