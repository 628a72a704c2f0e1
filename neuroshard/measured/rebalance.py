"""Rebalance a timed plan against marginal costs fitted to the timing runs themselves.

By the time refine has chosen a plan, its comparison run and finalist runs have timed every
device of ~10 plans of the task's own tables, in the groupings plans actually use: ~10 x D
device sets. The models err most on exactly those sets (10-24% on the plans' devices of
criteo-terabyte at 8 devices, docs/results.md, sessions 29-31), and polish's model-guided
proposals measured a median 0.7% worse where predicted 3.4% better (session 31). The runs
themselves say what the sets cost, so:

``fit_marginal_costs`` fits each table's marginal cost *in context* from them: a piece costs
its alone-cost (the calibrated model's prediction of the piece alone) times its table's
factor, a device the sum of its pieces plus one launch level; the factors shrink toward one
shared factor by a ridge (the runs have fewer devices than the task has tables; a factor is
left where the devices it sits on say so). An ordinary least-squares problem with a ridge
toward a free shared mean, so ``numpy.linalg.lstsq`` on the stacked rows; scikit-learn's
``Ridge`` shrinks toward zero, not toward a fitted mean.

``rebalance`` then moves and swaps whole pieces of a timed plan, offline: each device's
estimate is its *measured* time plus the fitted costs of what came in minus what left (the
device's own residual, what additivity misses about its set, stays), communication modelled
by the simulator, until no change lowers the slowest device by ``REBALANCE_MIN_GAIN``. A
measured time is also one run's noise, and a greedy walk that trusts it moves work onto the
devices that happened to measure fast (the winner's curse: session 32, 7 changes estimated
21% cheaper, measured 4.6% dearer). Given the noise of one run (``run_noise_var``, from the
plans refine timed more than once), the residual kept is shrunk by ``anchor_weight``: the
share of a device's deviation from the fitted costs that is its set's own rather than the
run's (empirical Bayes: the fit's residuals hold both, their variance less the noise's is
the sets' own). Row
blocks stay on their devices (TorchRec runs them in rank order), pinned tables stay where
they may go, memory holds. The result is a candidate that refine times against the plan it
came from (``measured.refine``); it is never written unmeasured.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..constants import block_counts
from ..plan import Plan
from ..search.placer import greedy_place
from ..search.rowwise import align_row_blocks
from ..search.simulator import Simulator
from ..tables import TableSet
from ..types import Piece, split_rows
from ..validate import check_row_blocks

#: the ridge on each table's factor around the shared factor, in units of a device's relative error:
#: a table whose pieces cost 10% of a mean device moved 0.5 off the shared factor weighs as a device
#: 5% off its measured time (one run's noise on a device is 2-5%, experiments/issue25_noise.py)
MARGINAL_RIDGE = 1.0
#: a table's fitted factor stays within this range of the shared factor (few devices, much noise)
FACTOR_RANGE = (0.5, 2.0)
#: a change is made when the estimated slowest device drops by this fraction at least
REBALANCE_MIN_GAIN = 0.003
#: at most this many changes per device: each moves the estimate further from what was measured
REBALANCE_STEPS_PER_DEVICE = 3
#: a rebalance of more changes than this is also cut after this many, and both are timed (refine):
#: the estimate grows optimistic with the number of changes (session 32, 8 devices: 1-2 changes
#: measured 2.4% and 4.2% cheaper where estimated 1% and 7%; 7 changes measured 4.6% dearer where
#: estimated 21% cheaper), and which prefix of the changes pays is for the timing to say
REBALANCE_SHORT = 2
#: an even repack (``repack(..., even=True)``: every device the same number of pieces, give or take one) is
#: timed when its fitted cost is at most this much above the plan's: the fitted costs are additive and do
#: not see what the even counts are tried for. On criteo-terabyte at 4 devices (seed 195, 48 whole tables,
#: experiments/results/count_balance_*) every grouping of even counts measured 0.99-1.00x the least total
#: work and every uneven one 1.04-1.15x, where the additive fit of its devices errs 6.4%; on two other tasks
#: (seed 197, dlrm-2021 seed 195) uneven counts did as little work or less: timing decides
EVEN_SLACK = 0.05
#: ``split_hot(..., repack=True, variant=v)``: the spread (log-normal sigma) of the packing keys of a variant.
#: On criteo-terabyte seed 201 at 4 devices the big tables' fitted costs lie within 10-40% of each other, and
#: packings the fit rated alike measured 1.00-1.11x in total work: 0.15 reorders tables within about that
SPLIT_REPACK_SPREAD = 0.15


@dataclass
class MarginalCosts:
    """Each table's factor on its pieces' alone-costs (``factor_[t]``), the devices' launch
    level (``level_ms_``), and how well the fit reproduces the sets it was fitted on
    (``fit_error_``: the mean relative error; ``residual_var_``: the mean squared one)."""

    factor_: np.ndarray
    shared_: float
    level_ms_: float
    fit_error_: float
    sets_: int
    residual_var_: float = 0.0

    def piece_ms(self, pieces: Sequence[Piece], alone_ms: np.ndarray) -> np.ndarray:
        """The marginal cost (ms) of ``pieces`` whose alone-costs are ``alone_ms``."""
        return np.asarray(alone_ms, dtype=np.float64) * self.factor_[[p.table for p in pieces]]

    def devices_ms(self, where: np.ndarray, marginal_ms: np.ndarray, devices: int) -> np.ndarray:
        """(devices,) the fitted cost of each device: the launch level plus the marginal costs
        (``piece_ms``) of the pieces placed on it (``where``); 0 for a device holding none."""
        held = np.bincount(where, minlength=devices) > 0
        return np.where(held, self.level_ms_ + np.bincount(where, weights=marginal_ms, minlength=devices), 0.0)

    def to_dict(self) -> dict:
        return {"sets": self.sets_, "fit_error": round(self.fit_error_, 4), "shared_factor": round(self.shared_, 4),
                "level_ms": round(self.level_ms_, 4),
                "factor_range": [round(float(self.factor_.min()), 4), round(float(self.factor_.max()), 4)]}


def fit_marginal_costs(sets: Sequence[Sequence[Piece]], times_ms: np.ndarray, alone_ms: Callable[[list], np.ndarray],
                       num_tables: int, ridge: float = MARGINAL_RIDGE) -> MarginalCosts:
    """Fit ``MarginalCosts`` to measured device ``sets`` (lists of pieces, non-empty) and their
    ``times_ms``; ``alone_ms(pieces)`` gives each piece's alone-cost (ms, the models')."""
    sets = [list(s) for s in sets]
    times = np.asarray(times_ms, dtype=np.float64)
    distinct = sorted({p for s in sets for p in s})
    alone = dict(zip(distinct, np.asarray(alone_ms(distinct), dtype=np.float64)))
    # unknowns: [level, shared, factor_0 .. factor_{T-1}]; each device a row, relative to its time
    rows = np.zeros((len(sets), 2 + num_tables))
    rows[:, 0] = 1.0
    for k, s in enumerate(sets):
        for p in s:
            rows[k, 2 + p.table] += alone[p]
    scale = 1.0 / np.maximum(times, 1e-9)
    a, b = rows * scale[:, None], np.ones(len(sets))
    # the ridge: sqrt(ridge) * (table's mean alone-cost / mean device time) * (factor_t - shared) = 0
    used = np.flatnonzero(rows[:, 2:].sum(axis=0) > 0)
    weight = rows[:, 2:].sum(axis=0)[used] / np.maximum((rows[:, 2:] > 0).sum(axis=0)[used], 1) / times.mean()
    penalty = np.zeros((len(used), 2 + num_tables))
    penalty[np.arange(len(used)), 2 + used] = np.sqrt(ridge) * weight
    penalty[:, 1] = -np.sqrt(ridge) * weight
    unused = np.setdiff1d(np.arange(num_tables), used)  # tables on no timed device: the shared factor
    tie = np.zeros((len(unused), 2 + num_tables))
    tie[np.arange(len(unused)), 2 + unused], tie[:, 1] = 1.0, -1.0
    x = np.linalg.lstsq(np.vstack([a, penalty, tie]), np.concatenate([b, np.zeros(len(used) + len(unused))]),
                        rcond=None)[0]
    if x[0] < 0:  # no negative launch level: fit again without one
        x = np.linalg.lstsq(np.vstack([a, penalty, tie])[:, 1:], np.concatenate([b, np.zeros(len(used) + len(unused))]),
                            rcond=None)[0]
        x = np.concatenate([[0.0], x])
    shared = float(x[1])
    factor = np.clip(x[2:], FACTOR_RANGE[0] * shared, FACTOR_RANGE[1] * shared)
    fitted = x[0] + rows[:, 2:] @ factor
    relative = fitted / times - 1
    return MarginalCosts(factor, shared, float(x[0]), float(np.mean(np.abs(relative))), len(sets),
                         float(np.mean(relative ** 2)))


def run_noise_var(repeats: Sequence[np.ndarray]) -> float | None:
    """The relative variance of one device's time in one run: each of ``repeats`` is one plan's
    devices timed in several runs ((runs, devices), ms); each device's times over their mean,
    their variance over the runs (ddof 1) pooled over every such device. None when no plan was
    timed twice."""
    deviations, dof = 0.0, 0
    for times in repeats:
        times = np.asarray(times, dtype=np.float64)
        if times.ndim != 2 or times.shape[0] < 2:
            continue
        mean = times.mean(axis=0)
        used = mean > 0
        if not used.any():
            continue
        deviations += float((((times[:, used] / mean[used]) - 1) ** 2).sum())
        dof += (times.shape[0] - 1) * int(used.sum())
    return deviations / dof if dof else None


def anchor_weight(costs: MarginalCosts, noise_var: float | None, runs: int = 1) -> float:
    """The share of a device's measured deviation from the fitted costs that an estimate keeps
    (see the module docstring): ``tau2 / (tau2 + noise_var / runs)``, where ``noise_var`` is one
    run's relative variance (``run_noise_var``), ``runs`` how many runs the anchor's times
    aggregate, and ``tau2 = residual_var_ - noise_var`` the sets' own variance (the fit's residuals
    are single runs' devices: they hold both). 1 (the measured time kept whole) without a noise
    estimate."""
    if noise_var is None or noise_var <= 0:
        return 1.0
    own = max(costs.residual_var_ - noise_var, 0.0)
    return own / (own + noise_var / max(int(runs), 1))


def whole_rows(pieces: Sequence[Piece], tables: TableSet) -> np.ndarray:
    """(pieces,) which pieces hold all their table's rows: those a change may move (row blocks
    stay on their devices, TorchRec runs them in rank order)."""
    return np.array([p.row_offset == 0 and p.num_rows == tables[p.table].num_embeddings for p in pieces])


def rebalance(plan: Plan, measured_ms: np.ndarray, costs: MarginalCosts, sim: Simulator,
              alone_ms: Callable[[list], np.ndarray], min_gain: float = REBALANCE_MIN_GAIN,
              steps_per_device: int = REBALANCE_STEPS_PER_DEVICE,
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
                   alone_ms: Callable[[list], np.ndarray], cuts: Sequence[int] = (REBALANCE_SHORT,),
                   min_gain: float = REBALANCE_MIN_GAIN, steps_per_device: int = REBALANCE_STEPS_PER_DEVICE,
                   noise_var: float | None = None, runs: int = 1) -> list[tuple[Plan | None, dict]]:
    """``rebalance`` and its walk cut after each of ``cuts`` changes, from one walk: the full
    rebalance first, then each cut shorter than it (``rebalance(..., max_changes=c)`` gives the
    same plan and record)."""
    walk = _walk(plan, measured_ms, costs, sim, alone_ms, min_gain, steps_per_device, None, noise_var, runs)
    done = len(walk.states)
    return [walk.result(done)] + [walk.result(c, cut=c) for c in sorted(set(cuts)) if 0 < c < done]


def repack(plan: Plan, costs: MarginalCosts, sim: Simulator, alone_ms: Callable[[list], np.ndarray],
           min_gain: float = REBALANCE_MIN_GAIN, steps_per_device: int = REBALANCE_STEPS_PER_DEVICE,
           even: bool = False) -> tuple[Plan | None, dict]:
    """The plan's whole pieces placed afresh, longest first, each on the device of least fitted
    cost with memory for it (LPT, ``search.placer.greedy_place``, over the marginal costs; row
    blocks and pinned tables stay where they are), then rebalanced from those fitted costs
    (``rebalance``, each device its fitted cost: nothing of it was measured). Where ``rebalance``
    moves a few pieces off the devices measured slowest, this places every whole table by the fit
    alone: the fitted costs are within 4-6% of the timed devices (session 32) where the models
    err 10-24%, and LPT's makespan is within 4/3 of the least on additive costs. Returns (None,
    record) when the pieces do not fit memory that way, or it is the same plan or one whose
    fitted cost is not ``min_gain`` below the plan's; the record:
    ``repacked`` (true), ``changes`` (the rebalance's) and the fitted cost before (the plan as
    it is) and after.

    ``even``: every device is capped at ceil(pieces / devices) pieces (the cap is passed over only
    where no device under it has memory for a piece), and the rebalance after it only swaps pieces,
    which keeps the counts; the result is returned when it is another placement than the plan's,
    the plan's counts are not already that even, and its fitted cost is at most ``EVEN_SLACK``
    above the plan's (record: ``even``, true). A device's cost is not additive in its tables: on some
    tasks a device of many tables costs more than their fitted sum (module constants), which the
    fitted costs cannot see, so this placement is one for the timing to judge."""
    pieces, where = sim.pieces_of_plan(plan)
    devices = plan.num_devices
    movable = whole_rows(pieces, sim.tables)
    marginal = costs.piece_ms(pieces, alone_ms(pieces))

    before = float(sim.evaluate_with_compute([(pieces, where)],
                                             costs.devices_ms(where, marginal, devices)[None, :]).max_ms[0])
    record = {"repacked": True, "estimated_cost_before_ms": round(before, 4), "changes": 0,
              "estimated_cost_after_ms": round(before, 4)}
    cap = int(np.ceil(len(pieces) / devices))
    if even:
        record["even"] = True
        if np.bincount(where, minlength=devices).max() <= cap:
            record["rejected"] = "even already"
            return None, record
    placed = _lpt(pieces, movable, where, marginal, sim, devices, int(min(plan.memory_limits())), even)
    if (placed < 0).any():
        record["rejected"] = "memory"
        return None, record
    packed = replace(plan, shards=sim.to_shards(pieces, placed), provenance=plan.provenance.to_dict())
    moved, info = rebalance(packed, costs.devices_ms(placed, marginal, devices), costs, sim, alone_ms, min_gain,
                            steps_per_device, swaps_only=even)
    record.update(changes=info["changes"], estimated_cost_after_ms=info["estimated_cost_after_ms"])
    out = moved if moved is not None else packed
    bar = before * (1 + EVEN_SLACK) if even else before * (1 - min_gain)
    if out.layout_key() == plan.layout_key() or info["estimated_cost_after_ms"] > bar:
        return None, record  # the same plan, or one the fit does not prefer: nothing to time
    problems = out.problems()
    if problems:  # a guard: the placement keeps memory and placement rules
        record["rejected"] = problems[0]
        return None, record
    return out, record


def split_hot(plan: Plan, measured_ms: np.ndarray, costs: MarginalCosts, sim: Simulator,
              alone_ms: Callable[[list], np.ndarray], min_gain: float = REBALANCE_MIN_GAIN,
              steps_per_device: int = REBALANCE_STEPS_PER_DEVICE, noise_var: float | None = None,
              runs: int = 1, row_blocks: str | None = None, repack: bool = False,
              variant: int = 0) -> tuple[Plan | None, dict]:
    """The plan with the dearest whole table of its slowest device cut into row blocks, the rest
    of the plan as it is, then rebalanced (``rebalance``). Where ``rebalance`` only moves whole
    tables, a plan whose slowest device is one hot table (the greedy plans of least total work,
    session 37: lookup's plan did 13% less work than the plan refine chose, and its slowest device
    was a hot table no move could lighten) needs that table split; the search splits hot tables
    too, but regroups the others around them, and its plans did 8-13% more work than lookup's
    on two criteo-terabyte tasks. Here the grouping the timing found cheap in total stays.

    The table is cut into the fewest row blocks that fit memory among the block counts allowed
    (``constants.block_counts`` for ``row_blocks``, None: the plan's own; ``rowwise.split_rows``,
    TorchRec's ceil blocks). All ranks: block ``i`` on device ``i`` (TorchRec's row-wise); with
    ``row_blocks="any"`` and fewer blocks: the first block stays, each other goes to the device of
    least estimate with memory for it, then the blocks are put in rank order (``align_row_blocks``),
    and the plan says ``row_blocks: any``. Each device's estimate is anchored as in ``rebalance``
    (``noise_var``, ``runs``); the blocks cost their fitted marginal costs. Returns (None, record)
    when no whole table is on the slowest device, no split fits memory, or the estimate does not
    drop by ``min_gain``; the record: ``split`` (the table's name; None when there was none to
    split), ``blocks``, the changes of the rebalance after it and the estimated cost before and
    after, ``rejected`` (why none was made).

    ``repack``: after the cut, every whole piece and the new blocks are placed afresh by the fitted
    costs (``repack``'s LPT with memory, the blocks on distinct devices), then rebalanced from the
    fitted costs (record: ``repacked``, true). Where memory is tight the blocks fit beside the rest
    of the plan nowhere (session 37: every cut of the least-work plan refused, 1.2-1.5x headroom;
    criteo-terabyte's big tables fill a device two at a time), but they do with the big tables
    paired afresh around them: on criteo-terabyte seed 201 at 4 devices, six such packings of the
    hottest table's row halves measured 0.89-0.93x lookup's slowest device, three of them at
    1.003-1.009x its total work and three 1.09-1.11x (``experiments/hot_cut_packings.py``): which big
    tables share a device moved a device by 15%, more than the fitted costs tell packings apart.
    ``variant`` > 0: the packing's keys each times ``exp(SPLIT_REPACK_SPREAD * z)``, ``z`` standard
    normal from a generator seeded with ``variant`` (a randomised LPT: other pairings of tables of
    near-equal cost, for the timing to choose from; record: ``variant``)."""
    pieces, where = sim.pieces_of_plan(plan)
    devices = plan.num_devices
    marginal = costs.piece_ms(pieces, alone_ms(pieces))
    estimate, weight = _anchored(where, marginal, measured_ms, costs, noise_var, runs)
    before = float(sim.evaluate_with_compute([(pieces, where)], estimate[None, :]).max_ms[0])
    record: dict = {"split": None, "estimated_cost_before_ms": round(before, 4), "changes": 0,
                    "estimated_cost_after_ms": round(before, 4)}
    if repack:
        record["repacked"] = True
        if variant:
            record["variant"] = int(variant)
    if noise_var is not None:
        record["anchor_weight"] = round(weight, 4)
    hot = int(np.argmax(estimate))
    whole = whole_rows(pieces, sim.tables) & np.array([p.num_cols == sim.tables[p.table].embedding_dim
                                                         for p in pieces])
    ours = np.flatnonzero((where == hot) & whole)
    if not len(ours):
        record["rejected"] = "no whole table on the slowest device"
        return None, record
    i = int(ours[np.argmax(marginal[ours])])
    table, piece = pieces[i].table, pieces[i]
    record["split"] = sim.tables[table].name
    mode = check_row_blocks(row_blocks or sim.row_blocks)
    limits = np.array(plan.memory_limits(), dtype=np.float64)
    rest = [q for k, q in enumerate(pieces) if k != i]
    rest_where = np.delete(where, i)
    counts = [c for c in block_counts(devices, sim.local_world_size, mode)
              if c <= devices and (c == devices or mode == "any")]
    made = (_cut_packed(piece, rest, rest_where, costs, sim, alone_ms, counts, devices, int(min(limits)), variant)
            if repack else
            _cut_in_place(i, pieces, where, rest, rest_where, marginal, estimate, hot, costs, sim, alone_ms, counts,
                          limits))
    if made is None:
        record["rejected"] = "memory"
        return None, record
    blocks, aligned, aligned_where, load = made
    record["blocks"] = len(blocks)
    split_plan = replace(plan, shards=sim.to_shards(aligned, aligned_where), provenance=plan.provenance.to_dict())
    if mode == "any" and len(blocks) < devices:  # row blocks TorchRec may not run: the exporter names the option
        split_plan.provenance["row_blocks"] = "any"
    problems = split_plan.problems()
    if problems:  # a guard: the split keeps memory and placement rules
        record["rejected"] = problems[0]
        return None, record
    moved, info = rebalance(split_plan, load, costs, sim, alone_ms, min_gain, steps_per_device)
    after = info["estimated_cost_before_ms"] if moved is None else info["estimated_cost_after_ms"]
    record.update(changes=info["changes"], estimated_cost_after_ms=after)
    if after > before * (1 - min_gain):
        return None, record
    return (moved if moved is not None else split_plan), record


def _cut_in_place(i: int, pieces: list, where: np.ndarray, rest: list, rest_where: np.ndarray, marginal: np.ndarray,
                  estimate: np.ndarray, hot: int, costs: MarginalCosts, sim: Simulator,
                  alone_ms: Callable[[list], np.ndarray], counts: list[int], limits: np.ndarray) -> tuple | None:
    """``split_hot``'s cut with the rest of the plan as it is (``rest``, on ``rest_where``: the plan
    without piece ``i``): piece ``i`` (on device ``hot``) in the
    fewest of ``counts`` row blocks that fit memory, all ranks in rank order, or (fewer blocks) the
    first on ``hot`` and each other on the device of least ``estimate`` with memory for it.
    Returns (blocks, pieces, devices in rank order, each device's estimate after) or None."""
    devices = len(estimate)
    piece = pieces[i]
    used = np.bincount(where, weights=sim.sizes_bytes(pieces), minlength=devices)
    used[hot] -= sim.sizes_bytes([piece])[0]
    mask = sim.device_mask([piece])
    base = estimate.copy()
    base[hot] -= marginal[i]
    for parts in counts:
        blocks = split_rows(piece, parts)
        sizes = sim.sizes_bytes(blocks)
        block_ms = costs.piece_ms(blocks, alone_ms(blocks))
        load, room = base.copy(), used.copy()
        if parts == devices:
            targets = list(range(devices))
        else:
            targets, free = [hot], [d for d in range(devices) if d != hot]
            for size in sizes[1:]:
                fits = [d for d in free if room[d] + size <= limits[d] and (mask is None or mask[0, d])]
                if not fits:
                    break
                d = min(fits, key=lambda d: (load[d], d))
                targets.append(d)
                free.remove(d)
        if len(targets) < parts:
            continue
        for d, ms, size in zip(targets, block_ms, sizes):
            load[d] += ms
            room[d] += size
        if (room > limits).any() or (mask is not None and not mask[0, targets].all()):
            continue
        aligned, aligned_where = align_row_blocks(rest + blocks, np.concatenate([rest_where, targets]).astype(np.int64),
                                                  sim.footprint, int(min(limits)))
        return blocks, aligned, aligned_where, load
    return None


def _cut_packed(piece: Piece, rest: list, rest_where: np.ndarray, costs: MarginalCosts, sim: Simulator,
                alone_ms: Callable[[list], np.ndarray], counts: list[int], devices: int, memory_bytes: int,
                variant: int = 0) -> tuple | None:
    """``split_hot``'s cut with the plan packed afresh: ``piece`` in the fewest of ``counts`` row blocks
    for which the blocks and every whole piece of ``rest`` fit memory placed by ``_lpt`` over the
    fitted costs (the blocks on distinct devices; ``rest``'s row blocks stay), the keys perturbed for
    a ``variant`` (``split_hot``). Returns (blocks, pieces, devices in rank order, each device's
    fitted cost) or None."""
    for parts in counts:
        blocks = split_rows(piece, parts)
        now = rest + blocks
        movable = np.concatenate([whole_rows(rest, sim.tables), np.ones(parts, dtype=bool)])
        hint = np.concatenate([rest_where, np.zeros(parts, dtype=np.int64)])
        marginal = costs.piece_ms(now, alone_ms(now))
        if variant:  # a randomised LPT: the same spread for every block count
            marginal = marginal * np.exp(SPLIT_REPACK_SPREAD * np.random.default_rng(variant).standard_normal(len(now)))
        placed = _lpt(now, movable, hint, marginal, sim, devices, memory_bytes)
        if (placed < 0).any():
            continue
        aligned, aligned_where = align_row_blocks(now, placed, sim.footprint, memory_bytes)
        return blocks, aligned, aligned_where, costs.devices_ms(aligned_where, costs.piece_ms(
            aligned, alone_ms(aligned)), devices)
    return None


def _lpt(pieces: Sequence[Piece], movable: np.ndarray, where: np.ndarray, marginal: np.ndarray, sim: Simulator,
         devices: int, memory_bytes: int, even: bool = False) -> np.ndarray:
    """(pieces,) the devices of ``pieces`` placed afresh, longest first by ``marginal``, each on the
    device of least sum with memory for it (``search.placer.greedy_place``): the pieces not
    ``movable`` stay on their devices (``where``), pinned tables where they may go, a table's
    pieces on distinct devices where memory allows; ``even``: every device capped at ceil(pieces
    / devices) pieces. -1 for every piece where memory runs out."""
    mask = sim.device_mask(pieces)
    allowed = np.ones((len(pieces), devices), dtype=bool) if mask is None else mask.copy()
    allowed[~movable] = False
    allowed[np.flatnonzero(~movable), where[~movable]] = True  # row blocks stay on their devices
    tables = np.array([p.table for p in pieces])
    counts = np.bincount(tables)
    groups = np.where(counts[tables] > 1, tables, -1)  # a table's pieces on distinct devices, where memory allows
    cap = int(np.ceil(len(pieces) / devices))
    return greedy_place(marginal, sim.sizes_bytes(pieces), devices, memory_bytes,
                        widths=np.ones(len(pieces)) if even else None, caps=np.array([cap]) if even else None,
                        groups=groups, allowed=allowed, first=~movable | (allowed.sum(axis=1) < devices))[0]


def _anchored(where: np.ndarray, marginal: np.ndarray, measured_ms: np.ndarray, costs: MarginalCosts,
              noise_var: float | None, runs: int) -> tuple[np.ndarray, float]:
    """Each device's estimate to start from (``rebalance``'s docstring): its measured time with
    its deviation from the fitted cost shrunk by ``anchor_weight``; and that weight."""
    estimate = np.asarray(measured_ms, dtype=np.float64).copy()
    weight = anchor_weight(costs, noise_var, runs)
    if weight < 1.0:  # shrink each device's residual toward its fitted cost (the run's noise is not its set's)
        fitted = costs.devices_ms(where, marginal, len(estimate))
        estimate = fitted + weight * (estimate - fitted)
    return estimate, weight


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
        problems = moved_plan.problems()
        if problems:  # a guard: the changes keep memory and placement rules
            record["rejected"] = problems[0]
            return None, record
        return moved_plan, record


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
    estimate, weight = _anchored(where, marginal, measured_ms, costs, noise_var, runs)

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


__all__ = ["MarginalCosts", "fit_marginal_costs", "rebalance", "rebalance_cuts", "repack", "split_hot", "whole_rows",
           "run_noise_var", "anchor_weight", "MARGINAL_RIDGE", "REBALANCE_MIN_GAIN", "REBALANCE_SHORT", "EVEN_SLACK"]
