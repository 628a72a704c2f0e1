"""Refine's polish: measured local-search steps off the slowest device of the plan chosen.

A model a few percent off per device leaves the slowest of 8 devices several percent above the
rest; only timing the devices themselves removes that. Each step times the change (a move, a
swap or a split of a shard off the slowest measured device) that the models predict best, and
keeps it only when the measured cost drops (docs/decisions.md#polish-slowest-device). Less total
work comes first, then balance: the lean plan (``measured.choice``) is polished too, and the two
polished plans are timed together (``polish_and_lean``).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..errors import NeuroShardError
from ..plan import Plan
from ..search.simulator import Simulator
from ..tables import TableSet
from ..validate import check_int, check_row_blocks
from .choice import Choice, final_check, measured_choice
from .config import DEFAULT_CONFIG, RefineConfig
from .plan_timing import per_set
from .rebalance_walk import whole_rows
from .rounds import round_of

log = logging.getLogger("neuroshard.measured.refine")  # the loop's stages log as refine


def default_polish_steps(devices: int, config: RefineConfig = DEFAULT_CONFIG) -> int:
    """Polish's measured steps for a plan of ``devices``: ``polish_steps_per_device`` per device, at least
    ``polish_steps``."""
    return max(config.polish_steps, config.polish_steps_per_device * devices)


def time_change(sets: list[list], calibration: Any, passes: int, repeats: int, record: dict) -> np.ndarray | None:
    """``sets`` (a change's devices before and after) timed in one interleaved run; None, with
    ``record["stopped"]`` saying why and ``record["end"]`` ``"stopped"``, when they cannot be
    timed now (e.g. no memory for them): polish then keeps what it gained so far."""
    try:
        return per_set(sets, calibration.time(sets, passes, "polish: timing a change", repeats))
    except NeuroShardError as exc:
        log.warning("polish stopped: %s", exc)
        record["stopped"] = str(exc).splitlines()[0]
        record["end"] = "stopped"
        return None


def top_mean(total_ms: np.ndarray, top: int) -> np.ndarray:
    """(P,) the mean of each plan's ``top`` slowest devices ((P, D) per-device costs)."""
    return np.sort(np.asarray(total_ms, dtype=np.float64), axis=1)[:, -top:].mean(axis=1)


class _Polish:
    """One polish under way: the plan's pieces and their devices (``pieces``, ``where``), each
    device's measured compute (``measured``, at the latest timing run's speed), the plan's measured
    objective and cost (``score``, ``cost``), the changes tried, and the record."""

    def __init__(self, plan: Plan, tables: TableSet, calibration: Any, models: Any, measured_ms: np.ndarray,
                 top: int, row_blocks: str | None, min_gain: float, record: dict):
        self.tables, self.calibration, self.models, self.min_gain, self.record = (tables, calibration, models,
                                                                                  min_gain, record)
        self.sim = Simulator.from_plan(plan, models, tables, calibration.models.batch_size)
        self.pieces, self.where = self.sim.pieces_of_plan(plan)
        self.limits = np.array(plan.memory_limits(), dtype=np.float64)
        self.devices = plan.num_devices
        self.measured = np.asarray(measured_ms, dtype=np.float64).copy()
        self.top = check_int(top, "polish top", 1, self.devices)
        record["objective_top_devices"] = self.top
        self.score, self.cost = (float(x[0]) for x in self.assess([(self.pieces, self.where)],
                                                                   self.measured[None, :]))
        record["measured_cost_before_ms"] = round(self.cost, 4)
        self.tried: set = set()
        self.by_rows = check_row_blocks(row_blocks or self.sim.row_blocks) == "any"  # whole tables split into row halves
        self.movable, self.splittable, self.sizes, self.mask = self.layout(self.pieces)

    def assess(self, candidates: list, compute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(objective, cost) of each candidate (pieces, devices) with ``compute`` (P, D)."""
        estimate = self.sim.evaluate_with_compute(candidates, compute)
        return top_mean(estimate.total_ms, self.top), estimate.max_ms

    def layout(self, pieces: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """What each piece allows (it changes only when a split is kept): moved (whole rows),
        split (a whole, unconstrained table whose width halves), its device bytes (a cached
        table's cache) and the devices it may go to (pinned tables; None: any)."""
        sim, tables = self.sim, self.tables
        movable = whole_rows(pieces, tables)
        splittable = np.array([movable[k] and p.num_cols == tables[p.table].embedding_dim
                               and (p.can_halve_rows() if self.by_rows else p.can_halve_cols())
                               and not (sim.constraints is not None and sim.constraints[p.table].any)
                               for k, p in enumerate(pieces)])
        return movable, splittable, sim.sizes_bytes(pieces), sim.device_mask(pieces)

    def may(self, i: int, d: int) -> bool:
        return self.mask is None or bool(self.mask[i, d])

    def proposals(self) -> tuple[list, np.ndarray]:
        """The changes off the slowest measured device not tried yet ((device a, device b, what, pieces
        after, devices after): a is the slowest device), and each device's measured/predicted ratio."""
        pieces, where, devices, sizes, limits, tried = (self.pieces, self.where, self.devices, self.sizes,
                                                         self.limits, self.tried)
        members = [np.flatnonzero(where == d) for d in range(devices)]
        ratio = np.ones(devices)
        busy = [d for d in range(devices) if len(members[d])]
        ratio[busy] = self.measured[busy] / self.calibration.predict([[pieces[i] for i in members[d]] for d in busy],
                                                                     self.models)
        hot = int(np.argmax(self.measured))
        used = np.bincount(where, weights=sizes, minlength=devices)
        changes = []
        for i in members[hot][self.movable[members[hot]]]:
            halves = ((pieces[i].halve_rows() if self.by_rows else pieces[i].halve_cols()) if self.splittable[i]
                      else None)
            half_bytes = float(self.sim.sizes_bytes([halves[1]])[0]) if halves else 0.0
            for d in range(devices):
                if d == hot or not self.may(i, d):
                    continue
                if used[d] + sizes[i] <= limits[d] and ("move", pieces[i], d) not in tried:
                    moved = where.copy()
                    moved[i] = d
                    changes.append((hot, d, ("move", pieces[i], d), pieces, moved))
                for j in members[d][self.movable[members[d]]]:
                    if (used[d] - sizes[j] + sizes[i] <= limits[d] and used[hot] - sizes[i] + sizes[j] <= limits[hot]
                            and self.may(j, hot) and ("swap", pieces[i], pieces[j], d) not in tried):
                        moved = where.copy()
                        moved[i], moved[j] = d, hot
                        changes.append((hot, d, ("swap", pieces[i], pieces[j], d), pieces, moved))
                if halves and used[d] + half_bytes <= limits[d] and ("split", pieces[i], d) not in tried:
                    rest = [k for k in range(len(pieces)) if k != i]
                    changes.append((hot, d, ("split", pieces[i], d), [pieces[k] for k in rest] + list(halves),
                                    np.append(where[rest], [hot, d])))
        return changes, ratio

    def guess(self, changes: list, ratio: np.ndarray) -> tuple[int, np.ndarray]:
        """The change the models predict best (its index) and each change's predicted objective: its
        two devices predicted, each scaled by its measured/predicted ``ratio``; a change that makes the
        slowest device slower is not tried."""
        new_sets = []
        for a, b, _, after, moved in changes:
            new_sets += [[after[k] for k in np.flatnonzero(moved == d)] for d in (a, b)]
        pairs = per_set(new_sets, self.calibration.predict([s for s in new_sets if s], self.models)).reshape(-1, 2)
        compute = np.repeat(self.measured[None, :], len(changes), axis=0)
        rows = np.arange(len(changes))
        a_idx, b_idx = np.array([c[0] for c in changes]), np.array([c[1] for c in changes])
        compute[rows, a_idx] = pairs[:, 0] * ratio[a_idx]
        compute[rows, b_idx] = pairs[:, 1] * ratio[b_idx]
        guesses, guessed_cost = self.assess([(c[3], c[4]) for c in changes], compute)
        guesses[guessed_cost > self.cost] = np.inf  # a change that makes the slowest device slower is not tried
        return int(np.argmin(guesses)), guesses

    def costs(self, now: np.ndarray, a: int, b: int, after: list, moved: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The plan's compute before and after the change with the two devices ``now``, and
        (objective, cost) of each: rows 0 before, 1 after."""
        measured = self.measured
        drift = (now[0] + now[1]) / max(measured[a] + measured[b], 1e-9)  # the other devices, at today's speed
        current, trial = measured * drift, measured * drift
        current[[a, b]], trial[[a, b]] = now[:2], now[2:]
        old_new = [self.assess([state], row[None, :]) for state, row in (((self.pieces, self.where), current),
                                                                        ((after, moved), trial))]
        return (current, trial, np.array([float(o[0][0]) for o in old_new]),
                np.array([float(o[1][0]) for o in old_new]))

    def gains(self, scores: np.ndarray, maxes: np.ndarray) -> bool:
        return bool(scores[1] < scores[0] * (1 - self.min_gain) and maxes[1] <= maxes[0])

    def judge(self, a: int, b: int, after: list, moved: np.ndarray, passes: int, repeats: int) -> tuple | None:
        """The change's two devices before and after it, timed in one interleaved run (drift-free): the
        plan's compute before and after, (objective, cost) of each, whether the change is kept and the
        timing runs it took; None when timing failed."""
        before = [[self.pieces[i] for i in np.flatnonzero(self.where == d)] for d in (a, b)]
        now_sets = [[after[i] for i in np.flatnonzero(moved == d)] for d in (a, b)]
        first = time_change([*before, *now_sets], self.calibration, passes, repeats, self.record)
        if first is None:
            return None
        timed = [first]
        current, trial, scores, maxes = self.costs(timed[0], a, b, after, moved)
        kept = self.gains(scores, maxes)
        if kept:
            # a gain is confirmed by a second interleaved run (one run's noise is a few percent per
            # device, and the best of many proposals would otherwise be kept for its luck): both
            # runs must show it, and their mean by more than min_gain
            again = time_change([*before, *now_sets], self.calibration, passes, repeats, self.record)
            if again is None:
                return None
            timed.append(again)
            _, _, scores_again, _ = self.costs(timed[1], a, b, after, moved)
            current, trial, scores, maxes = self.costs((timed[0] + timed[1]) / 2, a, b, after, moved)
            kept = self.gains(scores, maxes) and scores_again[1] < scores_again[0]
        return current, trial, scores, maxes, kept, len(timed)

    def step(self, passes: int, repeats: int) -> bool:
        """One measured step: the change predicted best, timed and kept or not. False when polish stops."""
        record = self.record
        changes, ratio = self.proposals()
        if not changes:
            record["end"] = "nothing to try"
            return False
        k, guesses = self.guess(changes, ratio)
        if guesses[k] >= self.score * (1 - self.min_gain):
            record["end"] = "no predicted gain"
            return False
        a, b, what, after, moved = changes[k]
        self.tried.add(what)
        record["steps"] += 1
        judged = self.judge(a, b, after, moved, passes, repeats)
        if judged is None:
            return False
        current, trial, scores, maxes, kept, runs = judged
        log.info("polish step %d: %s table %s between devices %d and %d: measured cost %.2f -> %.2f ms, "
                 "objective %.2f -> %.2f (predicted %.2f; %d timing runs)%s", record["steps"], what[0],
                 [self.sim.tables[q.table].name for q in what[1:-1]], a, b, maxes[0], maxes[1], scores[0], scores[1],
                 guesses[k], runs, "" if kept else ": not kept")
        if kept:
            self.pieces, self.where, self.measured = after, moved, trial
            self.score, self.cost = float(scores[1]), float(maxes[1])
            record["accepted"] += 1
            if what[0] == "split":
                record["splits"] += 1
                self.movable, self.splittable, self.sizes, self.mask = self.layout(self.pieces)
        else:
            self.measured, self.score, self.cost = current, float(scores[0]), float(maxes[0])
        return True

    def finish(self) -> None:
        """The record's measured cost after, and the slowest two devices' gap (a plateau no one move relieves)."""
        self.record["measured_cost_after_ms"] = round(self.cost, 4)
        ranked = np.sort(self.measured)[::-1]
        self.record["top_gap"] = (round(float(1 - ranked[1] / ranked[0]), 4) if len(ranked) > 1 and ranked[0] > 0
                                  else 0.0)

    def polished(self, plan: Plan, check: Callable[[Plan], tuple[Plan, dict]] | None) -> Plan:
        """The plan with the changes kept, checked (``check``: timed against ``plan``); ``plan`` when it is
        invalid or the check keeps it."""
        record = self.record
        polished = replace(plan, shards=self.sim.to_shards(self.pieces, self.where),
                           provenance=plan.provenance.to_dict())
        if self.by_rows and record["splits"]:  # row blocks TorchRec may not run: the exporter names the option
            polished.provenance["row_blocks"] = "any"
        problems = polished.problems()
        if problems:  # a guard: moves keep memory and layout rules, so this should not happen
            log.warning("polish: the polished plan is invalid (%s); keeping the refined plan", problems[0])
            record["rejected"] = problems[0]
            return plan
        if check is not None:
            written, record["final_check"] = check(polished)
            if written is plan:
                return plan
        at_tables = Simulator.from_plan(polished, self.models, self.tables)
        polished.estimate = {**(plan.estimate or {}), **at_tables.plan_estimate(at_tables.evaluate_plan(polished))}
        return polished


def polish(plan: Plan, tables: TableSet, calibration: Any, models: Any, measured_ms: np.ndarray,
           steps: int | None = None, timing_passes: int | None = None, timing_repeats: int | None = None,
           top: int | None = None, check: bool = True, row_blocks: str | None = None,
           config: RefineConfig = DEFAULT_CONFIG, budget: Any = None, stage: str = "polish") -> tuple[Plan, dict]:
    """A measured local search from ``plan`` whose devices measured ``measured_ms`` (at the
    models' batch size): each step proposes the change off the slowest device that the
    models predict best (each device's prediction scaled by its measured/predicted ratio):
    the move of one shard to another device, its swap with a shard there, or (a whole
    table whose width halves) its split into column halves, one moving to another device:
    a shard too heavy to move without overshooting can still give away half. With
    ``row_blocks="any"`` (None: the plan's own, ``provenance.row_blocks``) the table is split
    into two row blocks instead, as that search splits for balance (``search.neuroshard.rows_only``),
    and the polished plan says ``row_blocks: any``. The step times the two devices before and
    after the change in one interleaved run (the other devices' times are scaled by their
    drift), and keeps the change only when the plan's measured objective drops by more than
    ``polish_min_gain`` in that run, drops again in a second run, and by more than that on the
    mean of both, while its measured cost (the slowest device: measured compute plus modelled
    communication) does not rise. The objective is the mean of the ``top`` slowest devices
    (None: ``polish_top``, 1: the cost itself). At the end (``check``) the polished plan and
    ``plan`` are timed together (``final_check``): ``plan`` comes back unless the polished one
    measures cheaper. Row blocks stay where they are (TorchRec runs them in rank order), tables
    with constraints are not split, and pinned tables stay on their devices. Stops after
    ``steps`` steps (None: ``polish_steps``) or when no change is predicted to help; the
    record's ``end`` says which (``"steps"``, ``"no predicted gain"``, ``"nothing to try"``,
    ``"stopped"``: timing failed) and ``top_gap`` the measured gap between the two slowest
    devices then. ``timing_passes`` and ``timing_repeats`` (None: ``compare_passes``,
    ``compare_repeats``) time each change and the final check. With a ``budget``
    (``measured.budget.Budget``), a step is taken only while it and the final check fit (``end``:
    ``"budget"`` when not; the budget's stage ``stage``), and the plan comes back unpolished when the
    final check no longer fits (``final_check.skipped``)."""
    steps = config.polish_steps if steps is None else steps
    passes = config.compare_passes if timing_passes is None else timing_passes
    repeats = config.compare_repeats if timing_repeats is None else timing_repeats
    record = {"steps": 0, "accepted": 0, "splits": 0}
    if plan.data_parallel_tables:
        record["skipped"] = "replicated tables"
        return plan, record
    state = _Polish(plan, tables, calibration, models, measured_ms, config.polish_top if top is None else top,
                    row_blocks, config.polish_min_gain, record)
    record["end"] = "steps"  # why polish stopped (provenance.refine.polish.end)
    check_s = 0.0 if budget is None else budget.timing_s(2 * plan.num_devices, passes, config.final_check_runs)
    for k in range(steps):
        if budget is not None:
            step_s = budget.timing_s(4, passes, 2)  # two devices before and after, in up to two runs
            if not budget.fits(stage, step_s + check_s):
                record["end"] = "budget"
                budget.skip(stage, budget.out_of_time(stage, f"steps {k + 1}-{steps} and the final check",
                                                      step_s + check_s))
                break
            budget.say("timing a change off the slowest device", k + 1, steps)
        if not state.step(passes, repeats):
            break
    state.finish()
    if not record["accepted"]:
        return plan, record

    def timed_against_start(polished: Plan) -> tuple[Plan, dict]:
        if budget is not None and not budget.fits(stage, check_s):
            why = budget.out_of_time(stage, "the final check", check_s)
            budget.skip(stage, f"the final check ({why}); the plan stays unpolished")
            return plan, {"skipped": why}
        return final_check(plan, polished, tables, calibration, models, passes, repeats, config.final_check_runs)

    return state.polished(plan, timed_against_start if check else None), record


def polish_and_lean(plans: list[Plan], best: int, lean: int | None, compute: np.ndarray, choice: Choice,
                    polish_steps: int, row_blocks: Any, tables: TableSet, calibration: Any, models: Any,
                    record: dict, name: Callable[[int], str], history: list[dict],
                    config: RefineConfig = DEFAULT_CONFIG, budget: Any = None) -> tuple[Plan, int]:
    """``plans[best]`` polished (its devices measured ``compute``), and when there is a ``lean`` plan,
    that one polished too and the two timed together (``measured_choice``, a tie within ``tie_margin``
    going to less total work). Writes ``polish`` and ``lean`` into ``record`` (and ``chosen``,
    ``chosen_round`` when the lean plan is kept). Returns the plan and the index of the plan it
    started from. With a ``budget``, the lean plan is polished (stage ``lean``) only when its polish's
    first steps and the two runs after fit."""
    chosen, start = plans[best], best
    if not polish_steps:
        return chosen, start
    chosen, record["polish"] = polish(chosen, tables, calibration, models, compute, polish_steps,
                                      row_blocks=row_blocks, config=config, budget=budget)
    if lean is None:
        return chosen, start
    if budget is not None:
        cost = budget.timing_s(4 * config.budget_polish_steps + 4 * chosen.num_devices, config.compare_passes,
                               config.final_check_runs)
        if not budget.fits("lean", cost):
            budget.skip("lean", budget.out_of_time("lean", f"polishing {name(lean)}'s plan too", cost))
            return chosen, start
        with budget.stage("lean"):
            return _lean_too(plans, best, lean, chosen, start, choice, polish_steps, row_blocks, tables, calibration,
                             models, record, name, history, config, budget)
    return _lean_too(plans, best, lean, chosen, start, choice, polish_steps, row_blocks, tables, calibration, models,
                     record, name, history, config, budget)


def _lean_too(plans: list[Plan], best: int, lean: int, chosen: Plan, start: int, choice: Choice, polish_steps: int,
              row_blocks: Any, tables: TableSet, calibration: Any, models: Any, record: dict,
              name: Callable[[int], str], history: list[dict], config: RefineConfig,
              budget: Any) -> tuple[Plan, int]:
    """``polish_and_lean``'s second half: the lean plan polished, then timed against ``chosen`` (polished)."""
    lean_plan, lean_record = polish(plans[lean], tables, calibration, models, choice.latest_ms[lean], polish_steps,
                                    row_blocks=row_blocks, config=config, budget=budget, stage="lean")
    # the lean plan saves work against the plan the comparison and finalist runs chose
    record["lean"] = {"plan": name(lean), "total_compute_ms": round(float(np.sum(choice.first[lean])), 4),
                      "chosen_total_compute_ms": round(float(np.sum(choice.first[choice.best])), 4),
                      "polish": lean_record}
    if budget is not None:
        cost = budget.timing_s(2 * chosen.num_devices, config.compare_passes, config.final_check_runs)
        if not budget.fits("lean", cost):
            why = budget.out_of_time("lean", "timing the two polished plans together", cost)
            budget.skip("lean", f"{why}; the chosen plan stays")
            record["lean"]["skipped"] = why
            return chosen, start
        budget.say(f"timing {name(lean)}'s polished plan against the chosen one")
    try:
        kept, costs, totals = measured_choice([(name(best), chosen), (name(lean), lean_plan)], tables,
                                              calibration, models, config.compare_passes, config.compare_repeats,
                                              config.final_check_runs, config.tie_margin, config.work_allowance)
    except NeuroShardError as exc:  # e.g. no memory to time them now: the cheapest plan's stays
        record["lean"]["stopped"] = str(exc).splitlines()[0]
        return chosen, start
    record["lean"].update(measured_cost_ms=[round(c, 4) for c in costs],
                          measured_total_compute_ms=[round(t, 4) for t in totals], kept=kept == 1)
    if kept == 1:
        record.update(chosen=name(lean), chosen_round=round_of(lean, history))
        return lean_plan, lean
    return chosen, start


__all__ = ["default_polish_steps", "polish", "polish_and_lean", "time_change", "top_mean"]
