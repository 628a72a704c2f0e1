"""Row-wise splits and feasibility (hierarchical row/column partitioning, as in ZionEX).

A table larger than one device is split before any placement: first into column
halves (widths stay multiples of 4), then, when even its narrowest column shard
does not fit, into the fewest row ranges that do. A table narrower than twice
``MIN_COLUMN_SHARD_DIM`` goes straight to row blocks when TorchRec's block count of them
fits (one host's ranks or all ranks): every column strip does all of its table's lookups
and a narrow row's lookup costs nearly a wide one's, so narrow strips multiply the work
(the constant's comment has the measurements), and the search only splits further,
never joins strips back. Row splits of *hot* tables
that lower the simulated cost are proposed by the search itself; the simulator
charges the reduction they add.

**Row splits are TorchRec's blocks (the decision for interop).** TorchRec routes an
id of a row-wise table split in ``k`` shards to shard ``id // ceil(rows / k)``, so its
shards must be ``ceil(rows / k)`` rows each, the last one smaller (``ceil_blocks``).
Halving blocks one inside another does not give that (1,000,001 rows halved twice is
250,001 + 250,000 + 250,000 + 250,000, not 250,001 x 3 + 249,998), and no exporter can
remap it exactly. So the planner never halves a single row block: a table is a
regular grid, column *strips* (full-height column ranges) each cut into the same ``k``
ceil blocks of the table's rows. A row split re-cuts every strip of the table into
``2k`` ceil blocks, or straight into the block counts TorchRec runs (one host's
ranks, all ranks: ``split_table_rows``, as the NeuroShard search does), a column split halves every block of one strip (``halve_strip_cols``),
and ``split_rows`` cuts a strip into ceil blocks. Every row split we write then has
TorchRec's block sizes; whether its devices suit TorchRec (row block ``i`` on rank
``i`` of all ranks or of one host) the exporter (``export.torchrec_sharding``)
checks, refusing what TorchRec would run wrong. Before a plan is written,
``align_row_blocks`` puts each strip's blocks on its devices in ascending order
(TorchRec's rank order) and joins a strip whose blocks all landed on one device, and
neighbouring column strips whose blocks pair up on the same devices (``join_column_strips``).

**Unless told otherwise** (``row_blocks="any"``, ``constants.ROW_BLOCKS``): the block
counts are then also 2, 4, ... (``constants.block_counts``), still TorchRec's ceil sizes, on any
distinct devices; only ``align_row_blocks`` runs before writing. NeuroShard's runtime runs
such plans and the TorchRec exporter refuses them: for users of our runtime, whose hot
tables cost less in row halves than in TorchRec's layouts (measured in the constant's comment).
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import numpy as np

from ..constants import MIN_COLUMN_SHARD_DIM, block_counts, default_local_world_size
from ..errors import InfeasibleError
from ..types import Footprint, Piece, split_rows
from ..units import format_bytes

if TYPE_CHECKING:
    from .simulator import Simulator

log = logging.getLogger(__name__)

PlacedT = TypeVar("PlacedT")


def strip_of(pieces: Sequence[Piece], i: int) -> list[int]:
    """Indices of the pieces in the same column strip as ``pieces[i]`` (same table and
    columns), in row order."""
    p = pieces[i]
    same = [j for j, q in enumerate(pieces)
            if (q.table, q.col_offset, q.num_cols) == (p.table, p.col_offset, p.num_cols)]
    return sorted(same, key=lambda j: pieces[j].row_offset)


def split_table_rows(pieces: Sequence[Piece], i: int, parts: int | None = None,
                     max_parts: int | None = None, valid_parts: Sequence[int] | None = None) -> list[Piece] | None:
    """The pieces with every column strip of ``pieces[i]``'s table re-cut into ``parts``
    ceil blocks of the table's rows (default: the smallest of ``valid_parts`` above its
    blocks now, or twice its blocks), so the table stays a regular grid; None when that
    changes nothing or needs more than ``max_parts`` blocks."""
    table = pieces[i].table
    mine = [j for j, q in enumerate(pieces) if q.table == table]
    strips: dict[tuple[int, int], list[Piece]] = {}
    for j in mine:
        q = pieces[j]
        strips.setdefault((q.col_offset, q.num_cols), []).append(q)
    blocks = max(len(b) for b in strips.values())
    if parts is None and valid_parts is not None:
        parts = min((p for p in valid_parts if p > blocks), default=None)
        if parts is None:
            return None
    parts = 2 * blocks if parts is None else parts
    if max_parts is not None and parts > max_parts:
        return None
    recut = []
    for (col, cols), members in strips.items():
        first = min(q.row_offset for q in members)
        rows = sum(q.num_rows for q in members)
        recut += split_rows(Piece(table, first, rows, col, cols), parts)
    if len(recut) == len(mine):
        return None
    keep = set(mine)
    return sorted([*(q for j, q in enumerate(pieces) if j not in keep), *recut])


def halve_strip_cols(pieces: Sequence[Piece], i: int) -> list[Piece] | None:
    """The pieces with every block of ``pieces[i]``'s strip halved along columns; None
    when the strip's width cannot be halved (multiples of 4)."""
    if not pieces[i].can_halve_cols():
        return None
    strip = set(strip_of(pieces, i))
    halves = [h for j in strip for h in pieces[j].halve_cols()]
    return sorted([*(q for j, q in enumerate(pieces) if j not in strip), *halves])


def align_row_blocks(pieces: Sequence[Piece], devices: np.ndarray, footprint: Footprint,
                     memory_bytes: int) -> tuple[list[Piece], np.ndarray]:
    """Pieces and devices with each row-split strip's blocks moved onto the same devices in
    ascending order (block 0 on the lowest device: TorchRec's rank order) where they are
    on distinct devices and memory allows, a strip whose blocks are all on one device
    joined into one piece (same memory, no reduction), and then column strips joined
    (``join_column_strips``). The devices of every strip are unchanged."""
    devices = np.asarray(devices, dtype=np.int64).copy()
    strips: dict[tuple[int, int, int], list[int]] = {}
    for j, p in enumerate(pieces):
        strips.setdefault((p.table, p.col_offset, p.num_cols), []).append(j)
    sizes = footprint.sizes(pieces)
    joined: list[tuple[Piece, int]] = []
    drop: set[int] = set()
    for members in strips.values():
        members.sort(key=lambda j: pieces[j].row_offset)
        current = devices[members]
        if len(members) < 2:
            continue
        if len(set(current.tolist())) == 1:
            first, last = pieces[members[0]], pieces[members[-1]]
            joined.append((Piece(first.table, first.row_offset, last.row_offset + last.num_rows - first.row_offset,
                                 first.col_offset, first.num_cols), int(current[0])))
            drop.update(members)
        elif len(set(current.tolist())) == len(members):
            moved = devices.copy()
            moved[members] = np.sort(current)
            if fits_memory(moved, sizes, memory_bytes):
                devices = moved
    kept = [(p, int(d)) for j, (p, d) in enumerate(zip(pieces, devices.tolist())) if j not in drop]
    placed = join_column_strips(kept + joined)
    return [p for p, _ in placed], np.array([d for _, d in placed], dtype=np.int64)


def join_column_strips(placed: Sequence[tuple[Piece, int]]) -> list[tuple[Piece, int]]:
    """Placed pieces, sorted, with neighbouring column strips of a table joined where they
    are cut into the same row blocks and each block pair is on one device: a table's two
    column halves on one device become the whole table there.

    The decision: joining is unconditional, not left to the cost model. It
    changes neither a device's memory nor its pooled output, and the fused kernel on the
    CPU measured a hot table's column halves on one device 19-26% dearer than the table
    whole (docs/decisions.md#narrow-tables-by-rows); the pre-trained model had priced them cheaper,
    and the search kept both halves of a memory-split table on one device (criteo-terabyte,
    4 devices, seed 137: both tasks)."""
    by_table: dict[int, dict[tuple[int, int], list[tuple[Piece, int]]]] = {}
    for p, d in placed:
        by_table.setdefault(p.table, {}).setdefault((p.col_offset, p.num_cols), []).append((p, d))
    out: list[tuple[Piece, int]] = []
    for strips in by_table.values():
        merged: list[list[tuple[Piece, int]]] = []  # strips left to right, each its blocks in row order
        for (col, cols), blocks in sorted(strips.items()):
            blocks = sorted(blocks)
            if merged:
                prev = merged[-1]
                if prev[0][0].col_offset + prev[0][0].num_cols == col and \
                        [(p.row_offset, p.num_rows, d) for p, d in prev] == [(p.row_offset, p.num_rows, d) for p, d in blocks]:
                    merged[-1] = [(p._replace(num_cols=p.num_cols + cols), d) for p, d in prev]
                    continue
            merged.append(blocks)
        out += [b for blocks in merged for b in blocks]
    return sorted(out)


def strip_groups(pieces: Sequence[Piece]) -> np.ndarray:
    """Per piece, a number shared by the row blocks of one column strip (-1 for a strip
    of one block): placements keep a strip's blocks on distinct devices, as TorchRec
    runs them."""
    ids: dict[tuple[int, int, int], int] = {}
    counts: dict[tuple[int, int, int], int] = {}
    for p in pieces:
        counts[(p.table, p.col_offset, p.num_cols)] = counts.get((p.table, p.col_offset, p.num_cols), 0) + 1
    out = np.full(len(pieces), -1, dtype=np.int64)
    for j, p in enumerate(pieces):
        key = (p.table, p.col_offset, p.num_cols)
        if counts[key] > 1:
            out[j] = ids.setdefault(key, len(ids))
    return out


class RowBlockRule:
    """The row-block layouts TorchRec runs, kept while a tiered search places: the row blocks
    of one column strip on distinct devices, and a strip of one host's ``L`` blocks
    (``Simulator.local_world_size``) on that host, the rule the placer keeps where memory
    allows (``placer.greedy_place``'s groups) and the layouts TorchRec runs once
    ``align_row_blocks`` puts them in rank order (every strip of ``W`` blocks on ranks
    0..W-1, joined into one strip: row-wise; ``L`` blocks on one host's ranks: table-row-wise
    or a grid). ``allows``: a move keeps the rule; ``keeps``: a placement does.

    With ``row_blocks="torchrec"`` the search keeps the rule as it places: placed freely,
    row blocks were re-cut or joined (``runnable_row_splits``) before the plan was written,
    at costs the search never compared (docs/decisions.md#row-blocks-torchrec-default).
    Where no placement keeps it and no re-cut fits, an untiered search still places
    freely (the plan is then written as ``runnable_row_splits`` can, with a warning); a
    tiered one does not (its caches fill the devices, ``TIER_PACKING_HEADROOM``, so the
    re-cut seldom fits). With ``row_blocks="any"`` (``active`` false) every move and
    placement is allowed."""

    def __init__(self, sim: "Simulator", pieces: Sequence[Piece]):
        keep = sim.row_blocks != "any"
        self.groups = strip_groups(pieces) if keep else np.full(len(pieces), -1)
        self.active = bool((self.groups >= 0).any())
        self.local = sim.local_world_size if sim.local_world_size < sim.num_devices else None
        self.size = np.bincount(self.groups[self.groups >= 0]) if self.active else np.zeros(0, dtype=np.int64)
        self.where: dict[int, set[int]] = {}

    def update(self, devices: np.ndarray) -> None:
        """The devices each strip's blocks are on now."""
        if not self.active:
            return
        self.where = {}
        for piece in np.flatnonzero(self.groups >= 0).tolist():
            self.where.setdefault(int(self.groups[piece]), set()).add(int(devices[piece]))

    def allows(self, piece: int, target: int) -> bool:
        """Whether ``piece`` may move to device ``target`` (its strip's other blocks where they are)."""
        group = int(self.groups[piece]) if self.active else -1
        if group < 0:
            return True
        taken = self.where[group]
        if target in taken:
            return False
        if self.local is not None and self.size[group] == self.local:
            hosts = {d // self.local for d in taken}
            return len(hosts) > 1 or target // self.local in hosts
        return True

    def allows_all(self, pieces: np.ndarray, target: int) -> np.ndarray:
        return np.array([self.allows(int(p), target) for p in pieces], dtype=bool)

    def keeps(self, devices: np.ndarray) -> bool:
        """Whether every strip's blocks are on distinct devices, one host's when there are ``L``."""
        if not self.active:
            return True
        self.update(devices)
        for group, taken in self.where.items():
            if len(taken) < self.size[group]:
                return False
            if self.local is not None and self.size[group] == self.local and len({d // self.local for d in taken}) > 1:
                return False
        return True


def fits_memory(devices: np.ndarray, sizes: np.ndarray, memory_bytes: int | np.ndarray) -> bool:
    """Whether pieces of ``sizes`` on ``devices`` fit every device's memory (one figure for
    all, or (D,) per device)."""
    used = np.bincount(devices, weights=sizes, minlength=np.size(memory_bytes))
    return bool(np.all(used <= memory_bytes))


def _runnable(strips: dict[tuple[int, int], list[tuple[Piece, int]]], num_devices: int, local: int) -> bool:
    """Whether one table's strips (blocks in row order with their devices) are a layout
    TorchRec runs: unsplit strips, or every strip in ``L`` blocks on one host's ranks in
    order, or one strip in ``W`` blocks on ranks 0..W-1 (``L`` ranks per host)."""
    counts = {len(b) for b in strips.values()}
    if counts == {1}:
        return True
    for blocks in strips.values():
        devices = [d for _, d in blocks]
        if len(strips) == 1 and devices == list(range(num_devices)):
            continue
        if len(blocks) != local or devices[0] % local or devices != list(range(devices[0], devices[0] + local)):
            return False
    return True


def written_layout(sim: "Simulator", pieces: Sequence[Piece], devices: np.ndarray, room: int | np.ndarray,
                   quiet: bool = True) -> tuple[list[Piece], np.ndarray]:
    """The pieces and devices as a plan writes them (``search.api.make_plan``): with
    ``row_blocks="any"`` only aligned (``align_row_blocks``, kept as they are when joining a
    strip would break a per-table constraint), else laid out as TorchRec runs them
    (``runnable_row_splits``, costed by ``sim``; ``quiet``: no warning for a table no runnable
    layout fits). ``room``: the bytes each device has for shards.
    The search compares candidates in this layout, so the plan it writes is the one it chose."""
    if sim.row_blocks == "any":
        aligned = align_row_blocks(pieces, devices, sim.footprint, room)
        return aligned if sim.allows_placement(*aligned) else (list(pieces), np.asarray(devices))
    return runnable_row_splits(pieces, devices, sim.num_devices, sim.footprint, room,
                               lambda p, d: float(sim.evaluate(p, d[None, :]).max_ms[0]),
                               local_world_size=sim.local_world_size, allowed=sim.allows_placement, quiet=quiet)


def runnable_row_splits(pieces: Sequence[Piece], devices: np.ndarray, num_devices: int, footprint: Footprint,
                        memory_bytes: int, cost: Callable[[list[Piece], np.ndarray], float],
                        local_world_size: int | None = None,
                        allowed: Callable[[list[Piece], np.ndarray], bool] | None = None, quiet: bool = False
                        ) -> tuple[list[Piece], np.ndarray]:
    """Pieces and devices where every row-split table is laid out as TorchRec runs it.
    After ``align_row_blocks``, a table that is still not (blocks of one strip on
    repeated devices or on ranks TorchRec does not use, strips cut differently) gets the
    cheapest (by ``cost``) that fits memory of: its strips re-cut into one host's ``L``
    blocks on that host's ranks in order (every host), into ``W`` blocks on all ranks,
    or joined (each strip on the device holding most of it); when none fits, the same with
    whole tables moved off the full devices (``make_room``). When none fits even so it stays
    as it is, and the exporter refuses it (a warning says so unless ``quiet``). ``allowed``
    (per-table constraints) refuses layouts and devices as the search did."""
    aligned = align_row_blocks(pieces, devices, footprint, memory_bytes)
    if allowed is None or allowed(*aligned):  # joining a strip may leave too few shards
        pieces, devices = aligned
    local = local_world_size or default_local_world_size(num_devices)
    index: dict[int, list[int]] | None = None  # positions of each table's pieces, rebuilt when a table changes
    for table in sorted({p.table for p in pieces}):
        if index is None:
            index = {}
            for j, p in enumerate(pieces):
                index.setdefault(p.table, []).append(j)
        mine = index[table]
        strips: dict[tuple[int, int], list[tuple[Piece, int]]] = {}
        for j in sorted(mine, key=lambda j: pieces[j].row_offset):
            strips.setdefault((pieces[j].col_offset, pieces[j].num_cols), []).append((pieces[j], int(devices[j])))
        if _runnable(strips, num_devices, local):
            continue
        others = set(range(len(pieces))) - set(mine)
        rest = [(pieces[j], int(devices[j])) for j in sorted(others)]
        layouts = [[h * local + i for i in range(local)] for h in range(num_devices // local)]
        if local != num_devices:
            layouts.append(list(range(num_devices)))
        joined = []
        candidates = []
        for ranks in layouts:
            recut: list[tuple[Piece, int]] | None = []
            for (col, cols), blocks in strips.items():
                whole = Piece(table, min(p.row_offset for p, _ in blocks), sum(p.num_rows for p, _ in blocks), col, cols)
                cut = split_rows(whole, len(ranks))
                if len(cut) != len(ranks):  # fewer rows than ranks: no row-wise layout
                    recut = None
                    break
                recut += list(zip(cut, ranks))
            if recut is not None and len(ranks) != local and len(strips) > 1:
                recut = join_column_strips(recut)  # row_wise over all ranks is one strip: its strips side by side
            if recut is not None:
                candidates.append(recut)
        free = np.full(num_devices, 1.0) * memory_bytes
        for p, d in rest:
            free[d] -= footprint.of(p)
        for (col, cols), blocks in sorted(strips.items(), key=lambda kv: -kv[0][1]):  # widest first
            share: dict[int, int] = {}
            for p, d in blocks:
                share[d] = share.get(d, 0) + p.num_rows
            whole = Piece(table, min(p.row_offset for p, _ in blocks), sum(p.num_rows for p, _ in blocks), col, cols)
            # onto the holder with room for it (most rows first), else the one holding most
            fits = [d for d in share if free[d] >= footprint.of(whole)]
            device = max(fits or share, key=lambda d: (share[d], -d))
            free[device] -= footprint.of(whole)
            joined.append((whole, device))
        candidates.append(joined)
        options = []
        for option in candidates:
            placed = sorted(rest + option)
            cand_pieces = [p for p, _ in placed]
            cand_devices = np.array([d for _, d in placed], dtype=np.int64)
            sizes = footprint.sizes(cand_pieces)
            if fits_memory(cand_devices, sizes, memory_bytes) and (allowed is None or allowed(cand_pieces,
                                                                                                cand_devices)):
                options.append((cost(cand_pieces, cand_devices), cand_pieces, cand_devices))
        if not options:  # full devices (tiered plans fill them with caches): make room by moving whole tables
            for option in candidates:
                placed = make_room(rest, option, footprint, memory_bytes, num_devices)
                if placed is None:
                    continue
                cand_pieces = [p for p, _ in placed]
                cand_devices = np.array([d for _, d in placed], dtype=np.int64)
                if allowed is None or allowed(cand_pieces, cand_devices):
                    options.append((cost(cand_pieces, cand_devices), cand_pieces, cand_devices))
        if options:
            _, pieces, devices = min(options, key=lambda o: o[0])
            index = None
        elif not quiet:
            log.warning("table #%d: its row blocks are on ranks TorchRec does not run them on, and no layout it "
                        "runs fits the devices' memory: the plan does not export to TorchRec", table)
    return list(pieces), np.asarray(devices, dtype=np.int64)


def make_room(rest: Sequence[tuple[Piece, int]], fixed: Sequence[tuple[Piece, int]], footprint: Footprint,
              memory_bytes: int | np.ndarray, num_devices: int) -> list[tuple[Piece, int]] | None:
    """``rest`` and ``fixed`` placed together (sorted), with pieces of ``rest`` moved off the
    devices over memory until every device fits; None when that cannot be done. Only a
    piece whose table is unsplit along rows in ``rest`` moves (a row block's rank is its
    layout), each to the device with the most memory left that holds it: of an over-full
    device's pieces, the smallest that alone brings the device under its memory, else the
    largest. When no piece of the device fits elsewhere whole, its largest such piece is
    halved along columns (column-wise shards run on any ranks) and the halves tried again."""
    limits = np.broadcast_to(np.asarray(memory_bytes, dtype=np.float64), (num_devices,))
    placed = [(p, int(d)) for p, d in [*rest, *fixed]]
    sizes = np.array([footprint.of(p) for p, _ in placed], dtype=np.float64)
    used = np.bincount([d for _, d in placed], weights=sizes, minlength=num_devices).astype(np.float64)
    blocks: dict[tuple[int, int, int], int] = {}
    for p, _ in rest:
        blocks[(p.table, p.col_offset, p.num_cols)] = blocks.get((p.table, p.col_offset, p.num_cols), 0) + 1
    split = {t for (t, _, _), n in blocks.items() if n > 1}
    movable = [j < len(rest) and placed[j][0].table not in split for j in range(len(placed))]
    for device in np.argsort(limits - used, kind="stable").tolist():  # the fullest first
        while used[device] > limits[device]:
            over = used[device] - limits[device]
            moves = []
            for j, (p, d) in enumerate(placed):
                if d != device or not movable[j]:
                    continue
                room = limits - used
                room[device] = -np.inf
                target = int(room.argmax())
                if room[target] >= sizes[j]:
                    moves.append((sizes[j] < over, sizes[j] if sizes[j] >= over else -sizes[j], j, target))
            if not moves:
                halvable = [j for j, (p, d) in enumerate(placed) if d == device and movable[j] and p.can_halve_cols()]
                if not halvable:
                    return None
                j = max(halvable, key=lambda j: (sizes[j], -j))
                first, second = placed[j][0].halve_cols()
                placed[j] = (first, device)
                placed.append((second, device))
                sizes[j] = footprint.of(first)
                sizes = np.append(sizes, footprint.of(second))
                movable.append(True)
                continue
            _, _, j, target = min(moves)
            placed[j] = (placed[j][0], target)
            used[device] -= sizes[j]
            used[target] += sizes[j]
    return sorted(placed)


def split_for_memory(pieces: Sequence[Piece], memory_bytes: int, footprint: Footprint,
                     row_splits: bool = True, num_devices: int | None = None,
                     counts: Sequence[int] | None = None) -> list[Piece]:
    """Split every piece larger than a device: column halves while possible, then the
    fewest row blocks that fit; with ``num_devices``, the fewest of ``counts`` (the search's,
    ``Simulator.row_block_counts``; default ``constants.block_counts`` of ``num_devices``:
    TorchRec's, one host's ranks by its default or all ranks) that are enough, and then a table narrower than
    twice ``MIN_COLUMN_SHARD_DIM`` is cut into those row blocks without column halves
    first (see the module docstring)."""
    out: list[Piece] = []
    todo = list(pieces)
    if num_devices is not None and counts is None:
        counts = block_counts(num_devices)

    def row_parts(piece: Piece) -> int:
        max_rows = max(1, int(memory_bytes // footprint.row_bytes(piece)))
        parts = math.ceil(piece.num_rows / max_rows)
        if num_devices is not None:
            parts = min((p for p in counts if p >= parts), default=parts)
        return parts

    def narrow_rows_fit(piece: Piece) -> bool:
        """A narrow table whose row blocks TorchRec runs (its block count, on distinct ranks)."""
        return (num_devices is not None and piece.num_cols < 2 * MIN_COLUMN_SHARD_DIM
                and row_parts(piece) <= num_devices)

    while todo:
        piece = todo.pop()
        size = footprint.of(piece)
        if size <= memory_bytes:
            out.append(piece)
        elif piece.can_halve_cols() and not (row_splits and (footprint.prefers_row_splits(piece)
                                                              or narrow_rows_fit(piece))):
            todo.extend(piece.halve_cols())
        elif row_splits:
            out.extend(split_rows(piece, row_parts(piece)))
        else:
            raise InfeasibleError(f"a shard of table #{piece.table} ({piece.num_rows} rows x {piece.num_cols} "
                                  f"columns) is {format_bytes(size - memory_bytes)} over device memory and "
                                  f"row-wise splits are off")
    return sorted(out)


def halve_largest(pieces: Sequence[Piece], footprint: Footprint, row_splits: bool = True,
                  counts: Sequence[int] | None = None,
                  allowed: Callable[[list[Piece]], bool] | None = None) -> list[Piece] | None:
    """The pieces with the largest splittable one's strip halved along columns, else its
    table re-cut into more row blocks; None when nothing can be split further.
    ``counts``: the only block counts a table is re-cut into (the search's,
    ``Simulator.row_block_counts``: with ``row_blocks="torchrec"`` the counts TorchRec runs,
    so a split made here to fit memory is one the exporter takes); None: twice the blocks.
    ``allowed`` (per-table constraints, ``Simulator.allowed``) skips splits it refuses."""
    for i in sorted(range(len(pieces)), key=lambda i: -footprint.of(pieces[i])):
        splits = [halve_strip_cols(pieces, i)]
        if row_splits:
            splits.append(split_table_rows(pieces, i, valid_parts=counts) if counts else split_table_rows(pieces, i))
        if row_splits and footprint.prefers_row_splits(pieces[i]):  # a cached table: rows before columns
            splits = splits[1:] + splits[:1]
        for split in splits:
            if split is not None and (allowed is None or allowed(split)):
                return split
    return None


def place_with_splits(pieces: Sequence[Piece], place: Callable[[list[Piece]], PlacedT | None],
                      footprint: Footprint, row_splits: bool = True, max_attempts: int = 256,
                      counts: Sequence[int] | None = None,
                      allowed: Callable[[list[Piece]], bool] | None = None) -> PlacedT:
    """``place(pieces)``; while it cannot pack the pieces into memory, halve the largest
    piece and try again (``halve_largest``: ``counts``, ``allowed``). InfeasibleError when
    splitting does not help."""
    current = list(pieces)
    for attempt in range(max_attempts + 1):
        placed = place(current)
        if placed is not None:
            if attempt:
                log.info("packed after %d extra memory splits (%d shards)", attempt, len(current))
            return placed
        smaller = halve_largest(current, footprint, row_splits, counts, allowed)
        if smaller is None:
            break
        current = smaller
    raise InfeasibleError(f"could not pack {len(current)} shards into device memory after {attempt} extra "
                          f"splits; the tables are too close to the total memory (try more devices or memory)")
