"""The rebalance walk: whole pieces moved and swapped off a timed plan's slowest device, offline.

Each device's estimate is its *measured* time plus the fitted marginal costs
(``measured.marginal``) of what came in minus what left (the device's own residual, what
additivity misses about its set, stays, shrunk by ``anchor_weight`` toward the fitted cost when
the noise of one run is known), communication modelled by the simulator, until no change lowers
the slowest device by ``min_gain``. Row blocks stay on their devices (TorchRec runs them in rank
order), pinned tables stay where they may go, memory holds. The result is a candidate that
refine times against the plan it came from (``measured.rebalance``); it is never written
unmeasured.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..plan import Plan
from ..search.simulator import Simulator
from ..tables import TableSet
from ..types import Piece
from .config import DEFAULT_CONFIG
from .marginal import MarginalCosts, anchored_estimate


def whole_rows(pieces: Sequence[Piece], tables: TableSet) -> np.ndarray:
    """(pieces,) which pieces hold all their table's rows: those a change may move (row blocks
    stay on their devices, TorchRec runs them in rank order)."""
    return np.array([p.row_offset == 0 and p.num_rows == tables[p.table].num_embeddings for p in pieces])


def valid_or_rejected(plan: Plan, record: dict) -> tuple[Plan | None, dict]:
    """``(plan, record)`` when ``plan`` has no problems, else ``(None, record)`` with its first
    problem as ``record["rejected"]``: a guard, as the changes that made it keep memory and
    placement rules."""
    problems = plan.problems()
    if problems:
        record["rejected"] = problems[0]
        return None, record
    return plan, record


def rebalance(plan: Plan, measured_ms: np.ndarray, costs: MarginalCosts, sim: Simulator,
              alone_ms: Callable[[list], np.ndarray], min_gain: float = DEFAULT_CONFIG.rebalance_min_gain,
              steps_per_device: int = DEFAULT_CONFIG.rebalance_steps_per_device,
              max_changes: int | None = None, noise_var: float | None = None,
              runs: int = 1, swaps_only: bool = False) -> tuple[Plan | None, dict]:
    """The plan ``plan`` (its devices measured ``measured_ms``) with whole pieces moved and
    swapped off its slowest device while the anchored estimate (see the module docstring) of
    the slowest device drops by ``min_gain``; ``sim`` is the plan's simulator
    (``Simulator.from_plan``, at the batch the times are for). Returns (None, record) when no
    change was made, and the record: ``changes``, the estimated cost before and after. With
    ``max_changes`` it stops after that many changes (the first changes of the full rebalance:
    each step is the same greedy choice; record: ``cut_after``). With ``noise_var`` (one run's
    relative variance, ``run_noise_var``; ``runs``: how many runs ``measured_ms`` aggregates)
    each device starts from its fitted cost plus ``anchor_weight`` of its measured deviation
    from it (record: ``anchor_weight``). ``swaps_only``: no piece is moved alone (each device keeps
    its number of pieces)."""
    walk = _walk(plan, measured_ms, costs, sim, alone_ms, min_gain, steps_per_device, max_changes, noise_var, runs,
                 swaps_only)
    return walk.result(len(walk.states), cut=max_changes)


def rebalance_cuts(plan: Plan, measured_ms: np.ndarray, costs: MarginalCosts, sim: Simulator,
                   alone_ms: Callable[[list], np.ndarray], cuts: Sequence[int] = (DEFAULT_CONFIG.rebalance_short,),
                   min_gain: float = DEFAULT_CONFIG.rebalance_min_gain,
                   steps_per_device: int = DEFAULT_CONFIG.rebalance_steps_per_device,
                   noise_var: float | None = None, runs: int = 1) -> list[tuple[Plan | None, dict]]:
    """``rebalance`` and its walk cut after each of ``cuts`` changes, from one walk: the full
    rebalance first, then each cut shorter than it (``rebalance(..., max_changes=c)`` gives the
    same plan and record)."""
    walk = _walk(plan, measured_ms, costs, sim, alone_ms, min_gain, steps_per_device, None, noise_var, runs)
    done = len(walk.states)
    return [walk.result(done)] + [walk.result(c, cut=c) for c in sorted(set(cuts)) if 0 < c < done]


@dataclass
class _Walk:
    """A greedy rebalance walk: the plan, its pieces, the record of its start, and the state
    (placement, estimated slowest device) after each change."""

    plan: Plan
    sim: Simulator
    pieces: list
    record: dict
    states: list

    def result(self, changes: int, cut: int | None = None) -> tuple[Plan | None, dict]:
        """The plan after the walk's first ``changes`` changes (None when none) and its record."""
        record = dict(self.record, changes=changes)
        if cut is not None:
            record["cut_after"] = int(cut)
        if not changes:
            record["estimated_cost_after_ms"] = record["estimated_cost_before_ms"]
            return None, record
        where, now = self.states[changes - 1]
        record["estimated_cost_after_ms"] = round(now, 4)
        moved_plan = replace(self.plan, shards=self.sim.to_shards(self.pieces, where),
                             provenance=self.plan.provenance.to_dict())
        return valid_or_rejected(moved_plan, record)


def _walk(plan: Plan, measured_ms: np.ndarray, costs: MarginalCosts, sim: Simulator,
          alone_ms: Callable[[list], np.ndarray], min_gain: float, steps_per_device: int,
          max_changes: int | None, noise_var: float | None, runs: int, swaps_only: bool = False) -> _Walk:
    """The greedy walk of ``rebalance`` (its docstring), up to ``max_changes`` changes."""
    pieces, where = sim.pieces_of_plan(plan)
    devices = plan.num_devices
    movable = whole_rows(pieces, sim.tables)
    mask = sim.device_mask(pieces)
    sizes = sim.sizes_bytes(pieces)
    limits = np.array(plan.memory_limits(), dtype=np.float64)
    marginal = costs.piece_ms(pieces, alone_ms(pieces))
    estimate, weight = anchored_estimate(where, marginal, measured_ms, costs, noise_var, runs)

    def peaks(candidates: list, compute: np.ndarray) -> np.ndarray:
        # (P,) each candidate's slowest device; devices wait for each other in the exchange, so
        # every device's total is the same there: the slowest device is the one computing longest
        return sim.evaluate_with_compute(candidates, compute).max_ms

    now = float(peaks([(pieces, where)], estimate[None, :])[0])
    record = {"estimated_cost_before_ms": round(now, 4)}
    states = []
    if noise_var is not None:
        record["anchor_weight"] = round(weight, 4)
    limit = steps_per_device * devices if max_changes is None else min(max_changes, steps_per_device * devices)
    for _ in range(limit):
        hot = int(np.argmax(estimate))
        used = np.bincount(where, weights=sizes, minlength=devices)
        ours = np.flatnonzero((where == hot) & movable)
        changes, compute = [], []
        for i in ours:
            for d in range(devices):
                if d == hot or (mask is not None and not mask[i, d]):
                    continue
                # a piece does not join another of its table (that would undo a split, not merge it)
                if any(pieces[q].table == pieces[i].table for q in np.flatnonzero(where == d)):
                    continue
                if not swaps_only and used[d] + sizes[i] <= limits[d]:
                    moved = where.copy()
                    moved[i] = d
                    row = estimate.copy()
                    row[hot] -= marginal[i]
                    row[d] += marginal[i]
                    changes.append(moved)
                    compute.append(row)
                for j in np.flatnonzero((where == d) & movable):
                    if any(pieces[q].table == pieces[j].table for q in np.flatnonzero(where == hot) if q != i):
                        continue
                    if (marginal[j] < marginal[i] and used[d] - sizes[j] + sizes[i] <= limits[d]
                            and used[hot] - sizes[i] + sizes[j] <= limits[hot] and (mask is None or mask[j, hot])):
                        moved = where.copy()
                        moved[i], moved[j] = d, hot
                        row = estimate.copy()
                        row[hot] += marginal[j] - marginal[i]
                        row[d] += marginal[i] - marginal[j]
                        changes.append(moved)
                        compute.append(row)
        if not changes:
            break
        compute = np.array(compute)
        peak = peaks([(pieces, m) for m in changes], compute)
        spread = (compute ** 2).sum(axis=1)  # of equal peaks, the one that evens out the devices most
        k = min(range(len(changes)), key=lambda c: (round(float(peak[c]), 9), float(spread[c])))
        if peak[k] > now * (1 - min_gain):
            break
        where, estimate, now = changes[k], compute[k], float(peak[k])
        states.append((where, now))
    return _Walk(plan, sim, pieces, record, states)


__all__ = ["whole_rows", "rebalance", "rebalance_cuts"]
