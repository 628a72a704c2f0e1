"""Plans placed afresh by the fitted marginal costs: repacked, and the hot table cut.

Where the rebalance walk (``measured.rebalance_walk``) moves a few whole pieces off the devices
measured slowest, ``repack`` places every whole table afresh by the fitted costs
(``measured.marginal``; LPT with memory, as many pieces on every device with ``even``), and
``split_hot`` cuts the dearest whole table of the slowest device into row blocks, the rest of the
plan as it is or placed afresh around the blocks (docs/decisions.md#rebalance). Each result is
rebalanced by the walk and is a candidate for refine to time (``measured.rebalance``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from ..constants import block_counts
from ..plan import Plan
from ..search.placer import greedy_place
from ..search.rowwise import align_row_blocks
from ..search.simulator import Simulator
from ..types import Piece, split_rows
from ..validate import check_row_blocks
from .config import DEFAULT_CONFIG
from .marginal import MarginalCosts, anchored_estimate
from .rebalance_walk import rebalance, valid_or_rejected, whole_rows


def repack(plan: Plan, costs: MarginalCosts, sim: Simulator, alone_ms: Callable[[list], np.ndarray],
           min_gain: float = DEFAULT_CONFIG.rebalance_min_gain,
           steps_per_device: int = DEFAULT_CONFIG.rebalance_steps_per_device, even: bool = False,
           even_slack: float = DEFAULT_CONFIG.even_slack) -> tuple[Plan | None, dict]:
    """The plan's whole pieces placed afresh, longest first, each on the device of least fitted
    cost with memory for it (LPT, ``search.placer.greedy_place``, over the marginal costs; row
    blocks and pinned tables stay where they are), then rebalanced from those fitted costs
    (``rebalance``, each device its fitted cost: nothing of it was measured). Where ``rebalance``
    moves a few pieces off the devices measured slowest, this places every whole table by the fit
    alone: the fitted costs come closer to the timed devices than the models
    (docs/decisions.md#rebalance), and LPT's makespan is within 4/3 of the least on additive costs. Returns (None,
    record) when the pieces do not fit memory that way, or it is the same plan or one whose
    fitted cost is not ``min_gain`` below the plan's; the record:
    ``repacked`` (true), ``changes`` (the rebalance's) and the fitted cost before (the plan as
    it is) and after.

    ``even``: every device is capped at ceil(pieces / devices) pieces (the cap is passed over only
    where no device under it has memory for a piece), and the rebalance after it only swaps pieces,
    which keeps the counts; the result is returned when it is another placement than the plan's,
    the plan's counts are not already that even, and its fitted cost is at most ``even_slack``
    above the plan's (record: ``even``, true). A device's cost is not additive in its tables: on some
    tasks a device of many tables costs more than their fitted sum, which the fitted costs cannot
    see, so this placement is one for the timing to judge."""
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
    bar = before * (1 + even_slack) if even else before * (1 - min_gain)
    if out.layout_key() == plan.layout_key() or info["estimated_cost_after_ms"] > bar:
        return None, record  # the same plan, or one the fit does not prefer: nothing to time
    return valid_or_rejected(out, record)


def split_hot(plan: Plan, measured_ms: np.ndarray, costs: MarginalCosts, sim: Simulator,
              alone_ms: Callable[[list], np.ndarray], min_gain: float = DEFAULT_CONFIG.rebalance_min_gain,
              steps_per_device: int = DEFAULT_CONFIG.rebalance_steps_per_device, noise_var: float | None = None,
              runs: int = 1, row_blocks: str | None = None, repack: bool = False,
              variant: int = 0, spread: float = DEFAULT_CONFIG.split_repack_spread) -> tuple[Plan | None, dict]:
    """The plan with the dearest whole table of its slowest device cut into row blocks, the rest
    of the plan as it is, then rebalanced (``rebalance``): a plan whose slowest device is one hot
    table (often a greedy plan of least total work) needs that table split, and the search, which
    splits it too, regroups the rest around it (docs/decisions.md#rebalance).

    The table is cut into the fewest row blocks that fit memory among the block counts allowed
    (``constants.block_counts`` for ``row_blocks``, None: the plan's own; TorchRec's ceil blocks).
    All ranks: block ``i`` on device ``i`` (TorchRec's row-wise); with ``row_blocks="any"`` and
    fewer blocks: the first block stays, each other goes to the device of least estimate with
    memory for it, the blocks in rank order (``align_row_blocks``), and the plan says ``row_blocks:
    any``. Each device's estimate is anchored as in ``rebalance`` (``noise_var``, ``runs``); the
    blocks cost their fitted marginal costs. Returns (None, record) when no whole table is on the
    slowest device, no split fits memory, or the estimate does not drop by ``min_gain``; the
    record: ``split`` (the table's name; None: none to split), ``blocks``, the rebalance's changes,
    the estimated cost before and after, ``rejected`` (why none was made).

    ``repack``: after the cut, every whole piece and the new blocks are placed afresh by the fitted
    costs (``repack``'s LPT with memory, the blocks on distinct devices), then rebalanced from the
    fitted costs (record: ``repacked``, true): where memory is tight the blocks fit beside the plan
    as it is nowhere, but they do with the big tables paired afresh around them. ``variant`` > 0:
    the packing's keys each times ``exp(spread * z)``, ``z`` standard normal from a generator
    seeded with ``variant`` (a randomised LPT: other pairings of tables of near-equal cost, for the
    timing to choose from; record: ``variant``)."""
    pieces, where = sim.pieces_of_plan(plan)
    devices = plan.num_devices
    marginal = costs.piece_ms(pieces, alone_ms(pieces))
    estimate, weight = anchored_estimate(where, marginal, measured_ms, costs, noise_var, runs)
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
    made = (_cut_packed(piece, rest, rest_where, costs, sim, alone_ms, counts, devices, int(min(limits)), variant,
                        spread)
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
    if valid_or_rejected(split_plan, record)[0] is None:
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
                variant: int = 0, spread: float = DEFAULT_CONFIG.split_repack_spread) -> tuple | None:
    """``split_hot``'s cut with the plan packed afresh: ``piece`` in the fewest of ``counts`` row blocks
    for which the blocks and every whole piece of ``rest`` fit memory placed by ``_lpt`` over the
    fitted costs (the blocks on distinct devices; ``rest``'s row blocks stay), the keys perturbed by
    ``spread`` for a ``variant`` (``split_hot``). Returns (blocks, pieces, devices in rank order, each device's
    fitted cost) or None."""
    for parts in counts:
        blocks = split_rows(piece, parts)
        now = rest + blocks
        movable = np.concatenate([whole_rows(rest, sim.tables), np.ones(parts, dtype=bool)])
        hint = np.concatenate([rest_where, np.zeros(parts, dtype=np.int64)])
        marginal = costs.piece_ms(now, alone_ms(now))
        if variant:  # a randomised LPT: the same spread for every block count
            marginal = marginal * np.exp(spread * np.random.default_rng(variant).standard_normal(len(now)))
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


__all__ = ["repack", "split_hot"]
