"""The NeuroShard search (Zha et al., MLSys 2023), with row-wise splits added.

Two levels, both judged by the simulator (the pre-trained cost models):

* **Beam search over splits.** A state is a set of pieces (the tables, some of them
  split). A step halves one piece's column strip along columns (widths stay
  multiples of 4) for the top-n pieces by size and the top-n by predicted cost, or
  cuts the table of one of the top-n by cost into more row blocks (hot tables, as in
  ZionEX; the simulator charges the reduction a row split adds): as many as one
  host's ranks, then all ranks, TorchRec's row-wise layouts (``rowwise``). The k
  cheapest children form the next beam; L steps at most.
* **Greedy grid search for placement.** For one state: sort the pieces by predicted
  single-piece cost, put each on the least-loaded device (sum of predicted costs)
  that has memory for it and stays under a per-device width cap; sweep the cap over
  a grid (the cap balances communication, the loads balance compute) and keep the
  placement the simulator finds cheapest.
* **Local search.** The greedy balances sums of single-piece costs, but fused kernel
  costs are not additive: the best plan is then improved by moving single pieces off
  its slowest device, or swapping one of them with a smaller one elsewhere, while the
  simulator says the plan gets cheaper.
* **Splits must pay by a margin** (not in the paper; ``split_margin``, default 5%; a
  negative margin keeps the best split state even when simulated dearer, for measurement
  to decide: docs/decisions.md#split-margin). A
  split adds a shard, and every shard costs the fused kernel a pass over the batch's
  bags: measured on this project's CPU, plans that split tables for a simulated gain
  under 1% did 23% more total work (criteo-terabyte, 4 devices) and the demo's plan
  that split 12 tables into 16 shards measured 14-16% slower than size-lookup's. The
  least-split state and the beam's best are both locally searched, and the split one is
  kept only when simulated cheaper by more than the margin (``details['split_gain']``).
* **Heavy tables split together** (not in the paper): the beam splits one table a step,
  and while other heavy tables remain the slowest device does not change; the tables
  costlier alone than the mean device ("heavy-split"), and those costlier than half of it
  ("half-heavy-split", ``HALF_HEAVY_SHARE``), are also tried split at once.
* **Baseline seeds** (not in the paper; ``baseline_seeds``). The five classic greedy
  placements cost about 20 ms together; when the simulator finds one cheaper than
  the beam's best, the local search starts from it instead. So a NeuroShard plan is never
  simulated slower than the classic heuristics' best, and on easy tasks (few devices,
  many small tables) where balancing sums is already near-ideal it loses nothing.

Tables too large for one device are split first (``rowwise.split_for_memory``). Row splits
are TorchRec's block counts unless the task says ``row_blocks="any"`` (``Simulator.row_block_counts``);
then the search also cuts 2, 4, ... row blocks and splits for balance by rows only (``rows_only``).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, replace

import numpy as np

from ..errors import InfeasibleError
from ..types import Piece, Placement
from .baselines import GREEDY_KEYS, best_packing_greedy, greedy_by_key
from .params import NeuroShardParams
from .placer import greedy_place
from .rowwise import (RowBlockRule, halve_strip_cols, place_with_splits, split_table_rows, strip_groups,
                      written_layout)
from .simulator import Simulator

log = logging.getLogger(__name__)


def search(sim: Simulator, memory_bytes: int, params: NeuroShardParams | None = None, seed: int = 0) -> Placement:
    """The cheapest placement found for ``sim``'s tables on its devices (``seed``: the
    random baseline's, when baseline seeds are on)."""
    params = params or NeuroShardParams()
    start = sim.memory_split(memory_bytes, params.row_splits)
    large = bool(params.large_task) and len(start) * sim.num_devices >= params.large_task
    if large:  # production scale: no beam over splits; the pieces no device could balance are split first
        start = split_heaviest(sim, start, params)
        # each local-search step relieves one device: let every few devices have one
        params = replace(params, depth=0, local_search_steps=max(params.local_search_steps, sim.num_devices // 4))
    def place(pieces: list[Piece]) -> Placement:
        return place_with_splits(pieces, lambda p: place_many(sim, [p], memory_bytes, params)[0],
                                 sim.footprint, params.row_splits, counts=sim.row_block_counts,
                                 allowed=sim.allowed)

    best = place(start)
    least_split = best  # the state before any split the beam adds (tables too big for a device are cut)
    beam, seen, stale = [best], {tuple(best.pieces)}, 0
    for step in range(params.depth):
        children = []
        for state in beam:
            for child in split_children(sim, state.pieces, params):
                if tuple(child) not in seen:
                    seen.add(tuple(child))
                    children.append(child)
        placed = [c for c in place_many(sim, children, memory_bytes, params) if c is not None]
        if not placed:
            break
        beam = sorted(placed, key=lambda c: c.cost_ms)[:params.beam_width]
        log.debug("step %d: %d children, best %.4f ms (so far %.4f ms)", step, len(placed), beam[0].cost_ms,
                  best.cost_ms)
        if beam[0].cost_ms < best.cost_ms - 1e-9:
            best, stale = beam[0], 0
        else:
            stale += 1
            if stale >= params.patience:
                break
    starts = {"beam": least_split}
    if params.baseline_seeds:
        seeds = {}
        for key in GREEDY_KEYS:
            try:
                seeded = greedy_by_key(sim, memory_bytes, key, seed)
            except InfeasibleError:  # a baseline that cannot pack (e.g. around pinned tables) seeds nothing
                continue
            if RowBlockRule(sim, seeded.pieces).keeps(seeded.devices):  # nor one with row blocks TorchRec cannot run
                seeds[f"greedy-{key}"] = seeded
        # the local search ends in a local optimum of where it starts: from the least-split state and
        # the cheapest SEED_STARTS seeds, the cheapest end kept (ties: the earlier start)
        starts.update(sorted(seeds.items(), key=lambda kv: kv[1].cost_ms)[:SEED_STARTS])
    ends = {}
    for name, start_placement in starts.items():
        end, end_moves = local_search(sim, start_placement, memory_bytes, params.local_search_steps,
                                      params.local_search_swaps)
        ends[name] = (as_written(sim, end, memory_bytes), end_moves)
    origin = min(ends, key=lambda name: ends[name][0].cost_ms)
    unsplit, moves = ends[origin]
    chosen, gain, kept = unsplit, 0.0, -np.inf  # gain: the best split's (0: none); kept: the chosen split's
    splits = []  # split states, each kept only when it pays by more than the margin
    if len(best.pieces) > len(least_split.pieces):  # the beam split tables
        splits.append(("beam-split", best))
    if not large:
        # every table costlier alone than the balanced bound, split at once: the beam splits one
        # table a step, and while other such tables remain the slowest device does not change,
        # so the beam sees no gain and stops (patience) before the split that would pay
        mean_device = float(sim.evaluate(unsplit.pieces, unsplit.devices[None, :], risk=0.0).compute_ms.mean())
        # and (half-heavy-split) the tables of more than half a device each, split together: two or
        # three of them near the top keep their devices the slowest whatever one split does, and the
        # beam (one split a step) stops before the splits that pay together (criteo-terabyte at 8
        # devices, seed 169: three pooling-100 tables, each about the mean device alone: lookups x
        # columns 12,800 against a mean device's 10,660; docs/decisions.md#split-margin). Each state is tried when it splits more than the one before it.
        fewer = start
        for name, share in (("heavy-split", 1.0), ("half-heavy-split", HALF_HEAVY_SHARE)):
            state = split_heaviest(sim, start, params, bound=share * mean_device)
            if len(state) > len(fewer) and tuple(state) not in seen:
                try:
                    splits.append((name, place(state)))
                except InfeasibleError:
                    pass
            fewer = state
    split_gains = {}  # each split state's simulated gain over the unsplit plan (details)
    for name, state in splits:
        split, split_moves = local_search(sim, state, memory_bytes, params.local_search_steps,
                                          params.local_search_swaps)
        split = as_written(sim, split, memory_bytes)
        split_gain = 1.0 - split.cost_ms / unsplit.cost_ms if unsplit.cost_ms > 0 else 0.0
        log.debug("%s: %d pieces, simulated %.4f ms against %.4f unsplit", name, len(split.pieces), split.cost_ms,
                  unsplit.cost_ms)
        split_gains[name] = round(split_gain, 5)
        if split_gain > max(kept, params.split_margin):
            chosen, origin, moves, kept = split, name, split_moves, split_gain
        gain = max(gain, split_gain)
    chosen.details = {"parameters": asdict(params), "shards": len(chosen.pieces), "states_evaluated": len(seen),
                      "local_search_from": origin, "local_search_moves": moves, "split_gain": round(gain, 5),
                      "split_gains": split_gains,
                      "simulated_cost_ms": chosen.cost_ms}
    return chosen


def as_written(sim: Simulator, placement: Placement, room: int | np.ndarray) -> Placement:
    """``placement`` laid out as its plan is written (``rowwise.written_layout``: row blocks where
    TorchRec runs them) and costed so: the search compares the layouts it writes. A row split
    the search placed freely can cost far more once re-cut or joined (hot-few, 4 devices: a
    beam split simulated 454 ms was written as a plan of 654 ms, over the 516 ms of the
    size-lookup seed it had beaten), so a split is kept only when its written layout pays."""
    pieces, devices = written_layout(sim, placement.pieces, placement.devices, room)
    if list(pieces) == list(placement.pieces) and np.array_equal(devices, placement.devices):
        return placement
    cost = float(sim.evaluate(pieces, np.asarray(devices)[None, :]).max_ms[0])
    return Placement(list(pieces), np.asarray(devices), cost, placement.details)


#: the cheapest baseline seeds the local search also starts from (besides the least-split state)
SEED_STARTS = 2
#: devices a local-search step may move work to: the least loaded this many (all when fewer)
LOCAL_SEARCH_TARGETS = 64
#: a piece costing more than this share of the balanced bound is split up front on large tasks
HEAVY_SHARE = 1.0
#: the search also tries every table costing more than this share of the mean device split at once
#: ("half-heavy-split"; kept, as every split state, only when simulated cheaper by ``split_margin``)
HALF_HEAVY_SHARE = 0.5


def local_search(sim: Simulator, placement: Placement, memory_bytes: int, steps: int,
                 swaps: int = 0) -> tuple[Placement, int]:
    """Change one piece's device at a time, or (``swaps`` > 0) exchange two pieces, always
    involving the slowest device, to wherever the simulated plan cost drops most (memory
    and pinned devices permitting); stop when no change helps. Returns (placement, changes).

    Moves alone stall when every piece of the slowest device is bigger than the gap to
    the others: a swap of a big piece for a smaller one closes it. All moves are
    simulated; of the many swaps, the ``swaps`` whose *marginal* costs (a piece's set
    with and without it, which the fused kernel's amortisation makes far smaller than
    the piece's cost alone) come closest to halving the gap between the two devices.
    On more than ``LOCAL_SEARCH_TARGETS`` devices, work moves to that many of the least
    loaded (ready soonest) only, and candidates are costed incrementally
    (``Simulator.evaluate_moves``: two devices change per candidate)."""
    ids = sim.piece_ids(placement.pieces)
    sizes = sim.bytes_of(ids)
    limits = np.broadcast_to(np.asarray(sim.memory_limits(memory_bytes), dtype=np.float64), (sim.num_devices,))
    mask = sim.device_mask(placement.pieces)  # pinned tables move only among their devices
    blocks = RowBlockRule(sim, placement.pieces)  # a strip's row blocks stay apart (TorchRec's layouts)
    devices, cost = placement.devices.copy(), placement.cost_ms
    for move in range(steps):
        # every device's total includes waiting for the slowest in the exchange: the device
        # to relieve is the last one ready to send (compute, then its backward exchange)
        estimate = sim.evaluate_ids([(ids, devices)])
        loads = estimate.compute_ms[0] + estimate.bwd_comm_ms[0] + estimate.reduce_ms[0]
        slowest = int(loads.argmax())
        used = np.bincount(devices, weights=sizes, minlength=sim.num_devices)
        targets = np.arange(sim.num_devices)
        if sim.num_devices > LOCAL_SEARCH_TARGETS:
            # the readiest: every device's total is the last one's readiness plus its own exchange
            targets = np.sort(np.argsort(loads, kind="stable")[:LOCAL_SEARCH_TARGETS])
        candidates: list[tuple[tuple[int, int], ...]] = []
        blocks.update(devices)
        for piece in np.flatnonzero(devices == slowest):
            for target in targets[used[targets] + sizes[piece] <= limits[targets]]:
                if target != slowest and (mask is None or mask[piece, target]) and blocks.allows(piece, target):
                    candidates.append(((int(piece), int(target)),))
        if swaps:
            candidates += _swap_candidates(sim, ids, devices, slowest, loads, sizes, used, limits, mask, swaps,
                                           targets, blocks)
        if not candidates:
            return Placement(placement.pieces, devices, cost), move
        costs = sim.evaluate_moves(ids, devices, candidates)
        best = int(costs.argmin())
        if costs[best] >= cost - 1e-9:
            return Placement(placement.pieces, devices, cost), move
        devices = devices.copy()
        for i, d in candidates[best]:
            devices[i] = d
        cost = float(costs[best])
    return Placement(placement.pieces, devices, cost), steps


def _swap_candidates(sim: Simulator, ids: np.ndarray, devices: np.ndarray, slowest: int, loads: np.ndarray,
                     sizes: np.ndarray, used: np.ndarray, limits: np.ndarray, mask: np.ndarray | None,
                     count: int, targets: np.ndarray, blocks: RowBlockRule | None = None
                     ) -> list[tuple[tuple[int, int], ...]]:
    """Up to ``count`` exchanges of a piece of ``slowest`` with a piece of a device among
    ``targets``, ranked by how close the difference of their marginal costs comes to half
    the two devices' gap (only exchanges that move work off ``slowest`` and fit memory, and
    that ``blocks`` allows), as ``((piece, its new device), (other piece, slowest))``."""
    involved = sorted({slowest, *targets.tolist()})
    sets = {d: np.flatnonzero(devices == d) for d in involved}
    keys = [tuple(sorted(ids[sets[d]].tolist())) for d in involved]
    full = dict(zip(involved, sim.set_costs_ms(keys)))
    marginal = np.zeros(len(ids))
    without = [(d, k, tuple(sorted(ids[np.delete(sets[d], k)].tolist()))) for d in involved
               for k in range(len(sets[d]))]
    rest = sim.set_costs_ms([w for _, _, w in without])
    for (d, k, _), c in zip(without, rest):
        marginal[sets[d][k]] = full[d] - c
    mine = sets[slowest]
    pairs = []
    for d in involved:
        gap = loads[slowest] - loads[d]
        if d == slowest or gap <= 0 or not len(sets[d]):
            continue
        theirs = sets[d]
        delta = marginal[mine][:, None] - marginal[theirs][None, :]
        fits = ((used[d] - sizes[theirs][None, :] + sizes[mine][:, None] <= limits[d])
                & (used[slowest] - sizes[mine][:, None] + sizes[theirs][None, :] <= limits[slowest]))
        if mask is not None:
            fits &= mask[mine, d][:, None] & mask[theirs, slowest][None, :]
        if blocks is not None and blocks.active:
            fits &= blocks.allows_all(mine, d)[:, None] & blocks.allows_all(theirs, slowest)[None, :]
        ok = fits & (delta > 0) & (delta < gap)
        for a, b in zip(*np.nonzero(ok)):
            pairs.append((abs(delta[a, b] - gap / 2), int(mine[a]), int(theirs[b]), d))
    pairs.sort()
    return [((i, d), (j, slowest)) for _, i, j, d in pairs[:count]]


def split_heaviest(sim: Simulator, pieces: list[Piece], params: NeuroShardParams,
                   max_rounds: int = 64, bound: float | None = None) -> list[Piece]:
    """The pieces with every table whose piece costs more than the balanced bound (alone, by
    the compute model) split until none does or nothing splits further: its column strip
    halved, else (``row_splits``) its table re-cut into the next of ``Simulator.row_block_counts``
    (rows only with ``row_blocks="any"``: ``rows_only``). What the beam
    search finds one split at a time on small tasks, in a few batched rounds: a piece
    costlier than the bound keeps its device above it whatever the placement. ``bound``
    (ms): a fixed bound, e.g. the mean device of a placement (fused sets cost less than
    their shards alone, so the pieces' costs alone over the devices overstate it); None:
    the pieces' costs alone, summed and spread evenly, in every round."""
    valid = sim.row_block_counts
    fixed = bound
    for _ in range(max_rounds):
        costs = sim.single_costs_ms(pieces)
        bound = float(costs.sum()) / sim.num_devices if fixed is None else fixed
        heavy = [pieces[int(i)] for i in np.argsort(-costs, kind="stable") if costs[i] > HEAVY_SHARE * bound]
        if not heavy:
            break
        split_any = False
        done: set[int] = set()
        for p in heavy:  # one split per table and round, heaviest first (pieces move as others split)
            if p.table in done:
                continue
            done.add(p.table)
            j = pieces.index(p)
            for child in (None if rows_only(sim, params) else halve_strip_cols(pieces, j),
                          split_table_rows(pieces, j, valid_parts=valid) if params.row_splits else None):
                if child is not None and sim.allowed(child):
                    pieces, split_any = child, True
                    break
        if not split_any:
            break
    return pieces


def rows_only(sim: Simulator, params: NeuroShardParams) -> bool:
    """Whether the search splits tables for balance by rows only: with ``row_blocks="any"``
    a table's two row halves cost about its work whole, and its column halves more (each does
    all of the table's lookups). Measured (a study in the git history, AMD EPYC; extra total
    work of column halves against row halves): criteo-terabyte's pooling-100 table +8.1 against
    +0.4 ms, pooling 27 +1.3 against -1.3; dlrm-2021's four hottest +14.4/+3.7, +8.0/+1.0,
    +4.1/+0.6, +1.4/+0.2; only a cold table (pooling 3) cost less in columns (-2.2 against -1.2).
    Tables too large for a device are still split as ``split_for_memory`` does."""
    return sim.row_blocks == "any" and params.row_splits


def split_children(sim: Simulator, pieces: list[Piece], params: NeuroShardParams) -> list[list[Piece]]:
    """States one split away, for each of the top-n pieces by size and by cost: its
    column strip halved along columns, and (on equal footing: a hot table's lookups
    spread only over row blocks) its table re-cut into more row blocks: one host's
    ranks, then all ranks, as TorchRec runs them (whole strips and tables: see
    ``rowwise``)."""
    sizes = sim.sizes_bytes(pieces)
    costs = sim.single_costs_ms(pieces)
    by_size = [int(i) for i in np.argsort(-sizes, kind="stable")[:params.top_n]]
    by_cost = [int(i) for i in np.argsort(-costs, kind="stable")[:params.top_n]]
    candidates = list(dict.fromkeys(by_size + by_cost))
    children = [] if rows_only(sim, params) else [halve_strip_cols(pieces, i) for i in candidates]
    if params.row_splits:
        valid = sim.row_block_counts  # the row splits TorchRec runs (and more with row_blocks="any")
        children += [split_table_rows(pieces, i, valid_parts=valid) for i in candidates]
    unique = {tuple(c): c for c in children if c is not None and sim.allowed(c)}  # per-table constraints
    return list(unique.values())


def width_caps(sim: Simulator, params: NeuroShardParams) -> np.ndarray:
    """The grid of per-device width caps: from the mean width per device up, plus no cap."""
    mean = sim.total_dim / sim.num_devices
    caps = mean * np.linspace(1.0, params.max_cap_factor, max(params.grid_size - 1, 1))
    return np.append(np.ceil(caps), np.inf)


def place_many(sim: Simulator, states: list[list[Piece]], memory_bytes: int,
               params: NeuroShardParams) -> list[Placement | None]:
    """The best greedy placement over the cap grid of each state (None where the greedy
    cannot pack the state into memory); one simulator call for all of them."""
    caps = width_caps(sim, params)
    candidates, owners = [], []  # (ids, devices, pieces) and the state each is for
    for s, pieces in enumerate(states):
        ids = sim.piece_ids(pieces)
        devices = greedy_place(sim.single_costs_ms(ids), sim.bytes_of(ids), sim.num_devices, memory_bytes,
                               widths=sim.cols_of(ids), caps=caps, groups=strip_groups(pieces),
                               host_size=sim.host_size, **sim.placement_rules(pieces))
        distinct = {row.tobytes(): row for row in devices if row[0] >= 0}  # identical placements once
        blocks = RowBlockRule(sim, pieces)  # the placer keeps row blocks apart only where memory allows
        kept = [(ids, row, pieces) for row in distinct.values() if blocks.keeps(row)]
        if not kept and blocks.active:  # none does: each laid out as TorchRec runs it, where memory allows
            kept = [placed for row in distinct.values() if (placed := _runnable(sim, pieces, row, memory_bytes))]
            if not kept and sim.tiers is None:  # no layout TorchRec runs fits: placed freely, written as
                kept = [(ids, row, pieces) for row in distinct.values()]  # make_plan can (it warns)
        candidates += kept
        owners += [s] * len(kept)
    out: list[Placement | None] = [None] * len(states)
    if not candidates:
        return out
    costs = sim.evaluate_ids([(ids, row) for ids, row, _ in candidates]).max_ms
    for (_, row, pieces), s, cost in zip(candidates, owners, costs):
        if out[s] is None or cost < out[s].cost_ms:
            out[s] = Placement(list(pieces), row, float(cost))
    return out


def _runnable(sim: Simulator, pieces: list[Piece], devices: np.ndarray,
              memory_bytes: int) -> tuple[np.ndarray, np.ndarray, list[Piece]] | None:
    """A placement whose row blocks break ``RowBlockRule`` re-laid out as the plan is before it is
    written (``rowwise.written_layout``), as (ids, devices, pieces); None when it still breaks it."""
    pieces, devices = written_layout(sim, pieces, devices, memory_bytes)
    if not RowBlockRule(sim, pieces).keeps(devices):
        return None
    return sim.piece_ids(pieces), devices, list(pieces)


class NeuroShardSearch:
    """The NeuroShard search as a registered algorithm (``registry``). Never worse at finding
    a valid plan than the baselines it ships: when it cannot pack the shards, the cheapest
    classic greedy plan that packs (``baselines.best_packing_greedy``), saying why."""

    name = "neuroshard"
    params_type = NeuroShardParams

    def search(self, sim: Simulator, memory_bytes: int, params: NeuroShardParams | None = None,
               seed: int = 0) -> Placement:
        params = params or NeuroShardParams()
        try:
            return search(sim, memory_bytes, params, seed)
        except InfeasibleError as exc:
            fallback = best_packing_greedy(sim, memory_bytes, seed)
            if fallback is None:
                raise
            log.warning("the NeuroShard search could not pack the shards (%s); using the %s baseline's plan",
                        exc, fallback.details["fallback"]["algorithm"])
            fallback.details["fallback"]["reason"] = str(exc)
            fallback.details["parameters"] = {**fallback.details.get("parameters", {}), "neuroshard": asdict(params)}
            return fallback


ALGORITHM = NeuroShardSearch()
