"""Row-wise splits and feasibility (hierarchical row/column partitioning, as in ZionEX).

A table larger than one device is split before any placement: first into column
halves (widths stay multiples of 4), then, when even its narrowest column shard
does not fit, into the fewest equal row ranges that do. Row splits of *hot* tables
that lower the simulated cost are proposed by the search itself
(``Piece.halve_rows``); the simulator charges the reduction they add.
"""
from __future__ import annotations

import logging
import math
from typing import Callable, Sequence, TypeVar

from ..errors import InfeasibleError
from ..tables import TableSet
from ..units import format_bytes
from .simulator import Piece

log = logging.getLogger(__name__)

PlacedT = TypeVar("PlacedT")


def check_feasible(tables: TableSet, num_devices: int, memory_bytes: int, bytes_per_element: int,
                   row_splits: bool = True) -> None:
    """Raise InfeasibleError, saying by how much, when no plan can exist."""
    total = tables.total_bytes(bytes_per_element)
    capacity = num_devices * memory_bytes
    if total > capacity:
        raise InfeasibleError(
            f"tables '{tables.name}' need {format_bytes(total)} but {num_devices} devices x "
            f"{format_bytes(memory_bytes)} hold {format_bytes(capacity)}: {format_bytes(total - capacity)} too much "
            f"(need at least {math.ceil(total / memory_bytes)} devices of this memory)")
    for table in tables:
        narrowest = narrowest_cols(table.embedding_dim)
        if row_splits:
            need = narrowest * bytes_per_element  # one row of the narrowest column shard
        else:
            need = table.num_embeddings * narrowest * bytes_per_element
        if need > memory_bytes:
            raise InfeasibleError(
                f"table '{table.name}' fits on no device even fully split: its smallest shard "
                f"({'1' if row_splits else table.num_embeddings} rows x {narrowest} columns) needs "
                f"{format_bytes(need)}, {format_bytes(need - memory_bytes)} over the {format_bytes(memory_bytes)} "
                f"of a device" + ("" if row_splits else " (row-wise splits are off)"))


def narrowest_cols(dim: int) -> int:
    """Width reached by halving ``dim`` while both halves stay multiples of 4."""
    while dim % 8 == 0:
        dim //= 2
    return dim


def split_rows(piece: Piece, parts: int) -> list[Piece]:
    """``parts`` row ranges of (nearly) equal size."""
    parts = max(1, min(parts, piece.num_rows))
    cuts = [piece.row_offset + (piece.num_rows * i) // parts for i in range(parts + 1)]
    return [Piece(piece.table, lo, hi - lo, piece.col_offset, piece.num_cols) for lo, hi in zip(cuts, cuts[1:])]


def split_for_memory(pieces: Sequence[Piece], memory_bytes: int, bytes_per_element: int,
                     row_splits: bool = True) -> list[Piece]:
    """Split every piece larger than a device: column halves while possible, then the
    fewest equal row ranges that fit."""
    out: list[Piece] = []
    todo = list(pieces)
    while todo:
        piece = todo.pop()
        size = piece.size_bytes(bytes_per_element)
        if size <= memory_bytes:
            out.append(piece)
        elif piece.can_halve_cols():
            todo.extend(piece.halve_cols())
        elif row_splits:
            out.extend(split_rows(piece, math.ceil(size / memory_bytes)))
        else:
            raise InfeasibleError(f"a shard of table #{piece.table} ({piece.num_rows} rows x {piece.num_cols} "
                                  f"columns) is {format_bytes(size - memory_bytes)} over device memory and "
                                  f"row-wise splits are off")
    return sorted(out)


def halve_largest(pieces: Sequence[Piece], bytes_per_element: int, row_splits: bool = True) -> list[Piece] | None:
    """The pieces with the largest splittable one halved (columns first, then rows);
    None when nothing can be split further."""
    for i in sorted(range(len(pieces)), key=lambda i: -pieces[i].size_bytes(bytes_per_element)):
        piece = pieces[i]
        if piece.can_halve_cols():
            halves = piece.halve_cols()
        elif row_splits and piece.can_halve_rows():
            halves = piece.halve_rows()
        else:
            continue
        return sorted([*pieces[:i], *halves, *pieces[i + 1:]])
    return None


def place_with_splits(pieces: Sequence[Piece], place: Callable[[list[Piece]], PlacedT | None],
                      bytes_per_element: int, row_splits: bool = True, max_rounds: int = 256) -> PlacedT:
    """``place(pieces)``; while it cannot pack the pieces into memory, halve the largest
    piece and try again. InfeasibleError when splitting does not help."""
    current = list(pieces)
    for round_ in range(max_rounds + 1):
        placed = place(current)
        if placed is not None:
            if round_:
                log.info("packed after %d extra memory splits (%d shards)", round_, len(current))
            return placed
        smaller = halve_largest(current, bytes_per_element, row_splits)
        if smaller is None:
            break
        current = smaller
    raise InfeasibleError(f"could not pack {len(current)} shards into device memory after {round_} extra "
                          f"splits; the tables are too close to the total memory (try more devices or memory)")
