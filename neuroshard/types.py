"""Plain types every layer shares: the pieces a search places, a placement, the estimate
of candidate placements, the layout geometry TorchRec runs (ceil row blocks, column
strips), and the device-timer protocol of the measured loop.

Nothing here computes a cost or times hardware; it is the vocabulary of ``search``,
``constraints``, ``costmodels.samples`` and the measured loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol, Sequence

import numpy as np

from .optimizers import DEFAULT_OPTIMIZER, shard_bytes
from .tiers import IN_DEVICE_MEMORY, Tier

if TYPE_CHECKING:
    from .plan import Shard
    from .tables import TableSet


class Piece(NamedTuple):
    """A shard before it is placed: rows [row_offset, +num_rows) x cols [col_offset, +num_cols)
    of table number ``table``. A tuple: cheap to hash, sorts by table, then rows, then columns."""

    table: int
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int

    def size_bytes(self, bytes_per_element: int, optimizer: str = DEFAULT_OPTIMIZER) -> int:
        """Memory of the piece: weights plus ``optimizer``'s state (``optimizers.shard_bytes``)."""
        return shard_bytes(self.num_rows, self.num_cols, bytes_per_element, optimizer)

    def can_halve_cols(self) -> bool:
        """Two halves of widths that are multiples of 4."""
        return self.num_cols % 8 == 0

    def can_halve_rows(self) -> bool:
        return self.num_rows >= 2

    def halve_cols(self) -> tuple["Piece", "Piece"]:
        half = self.num_cols // 2
        return (Piece(self.table, self.row_offset, self.num_rows, self.col_offset, half),
                Piece(self.table, self.row_offset, self.num_rows, self.col_offset + half, half))

    def halve_rows(self) -> tuple["Piece", "Piece"]:
        """Two row ranges in TorchRec's block layout: ``ceil(rows / 2)`` first, the rest
        after. The search re-cuts whole tables instead (``rowwise.split_table_rows``),
        so nested halvings never leave blocks TorchRec would route differently."""
        half = (self.num_rows + 1) // 2
        return (Piece(self.table, self.row_offset, half, self.col_offset, self.num_cols),
                Piece(self.table, self.row_offset + half, self.num_rows - half, self.col_offset, self.num_cols))


@dataclass(frozen=True)
class Footprint:
    """Device memory of pieces: weights plus ``optimizer``'s state, or for a table whose rows
    live in host memory or on SSD only its device cache (``tiers``: one ``Tier`` per table
    index; None: every table in device memory). The one size rule of every placer."""

    bytes_per_element: int
    optimizer: str = DEFAULT_OPTIMIZER
    tiers: tuple[Tier, ...] | None = None

    def tier(self, piece: Piece) -> Tier:
        """The tier of ``piece``'s table."""
        return IN_DEVICE_MEMORY if self.tiers is None else self.tiers[piece.table]

    def of(self, piece: Piece) -> int:
        """Device bytes of ``piece``."""
        return self.tier(piece).device_bytes(piece.num_rows, piece.num_cols, self.bytes_per_element, self.optimizer)

    def sizes(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Device bytes of each piece, as float64 for the placers."""
        return np.array([self.of(p) for p in pieces], dtype=np.float64)

    def prefers_row_splits(self, piece: Piece) -> bool:
        """Whether ``piece``'s table is cached: its column strips would each keep a cache
        with its own per-row bookkeeping, so it is cut into row blocks first."""
        return not self.tier(piece).on_device

    def row_bytes(self, piece: Piece) -> float:
        """Device bytes per row of ``piece`` (averaged over a cached table's rows): what a
        row split divides memory by."""
        return float(self.tier(piece).device_row_bytes(piece.num_cols, self.bytes_per_element, self.optimizer))


def whole_pieces(tables: TableSet) -> list[Piece]:
    """One piece per table (table-wise)."""
    return [Piece(i, 0, t.num_embeddings, 0, t.embedding_dim) for i, t in enumerate(tables)]


@dataclass
class Placement:
    """A searched plan before it becomes a ``Plan``: pieces, the device of each, and what
    the algorithm wants recorded (its parameters, its simulated cost)."""

    pieces: list[Piece]
    devices: np.ndarray
    cost_ms: float = float("nan")
    details: dict = field(default_factory=dict)


@dataclass
class Estimate:
    """Predicted costs of ``P`` candidate plans over ``D`` devices (ms at the tables' batch size)."""

    compute_ms: np.ndarray   # (P, D)
    fwd_comm_ms: np.ndarray  # (P, D)
    bwd_comm_ms: np.ndarray  # (P, D)
    reduce_ms: np.ndarray    # (P, D)
    allreduce_ms: np.ndarray | None = None  # (P, D) gradient all-reduce of data-parallel tables, when any
    intra_host_ms: np.ndarray | None = None  # (P, D) of fwd + bwd: the intra-host part (topology with hosts)
    inter_host_ms: np.ndarray | None = None  # (P, D) of fwd + bwd: the inter-host part (topology with hosts)

    @property
    def total_ms(self) -> np.ndarray:
        """(P, D) per-device cost."""
        total = self.compute_ms + self.fwd_comm_ms + self.bwd_comm_ms + self.reduce_ms
        return total if self.allreduce_ms is None else total + self.allreduce_ms

    @property
    def max_ms(self) -> np.ndarray:
        """(P,) cost of each plan: its slowest device."""
        return self.total_ms.max(axis=1)

    def to_dict(self, index: int = 0) -> dict:
        """The plan file's ``estimate`` object for candidate ``index``."""
        def ms(row: np.ndarray) -> list[float]:
            return [round(float(x), 6) for x in row]
        return {"max_device_cost_ms": round(float(self.max_ms[index]), 6),
                "per_device_cost_ms": ms(self.total_ms[index]),
                "per_device_compute_ms": ms(self.compute_ms[index]),
                "per_device_fwd_comm_ms": ms(self.fwd_comm_ms[index]),
                "per_device_bwd_comm_ms": ms(self.bwd_comm_ms[index]),
                "per_device_reduce_ms": ms(self.reduce_ms[index]),
                **({} if self.allreduce_ms is None else {"per_device_allreduce_ms": ms(self.allreduce_ms[index])}),
                **({} if self.intra_host_ms is None else
                   {"per_device_intra_host_comm_ms": ms(self.intra_host_ms[index]),
                    "per_device_inter_host_comm_ms": ms(self.inter_host_ms[index])})}


def narrowest_cols(dim: int) -> int:
    """Width reached by halving ``dim`` while both halves stay multiples of 4."""
    while dim % 8 == 0:
        dim //= 2
    return dim


def ceil_blocks(num_rows: int, parts: int) -> list[tuple[int, int]]:
    """``(row_offset, num_rows)`` of TorchRec's row-wise blocks: ``ceil(num_rows / parts)``
    rows each, the last block smaller; fewer than ``parts`` blocks when the remainder
    runs out (e.g. 5 rows in 4 parts: 2, 2, 1), never an empty one."""
    block = -(-num_rows // max(1, parts))
    return [(lo, min(block, num_rows - lo)) for lo in range(0, num_rows, block)]


def split_rows(piece: Piece, parts: int) -> list[Piece]:
    """``piece`` in ``parts`` row ranges, TorchRec's ceil blocks of its rows (``ceil_blocks``)."""
    return [Piece(piece.table, piece.row_offset + lo, n, piece.col_offset, piece.num_cols)
            for lo, n in ceil_blocks(piece.num_rows, parts)]


def layout_kind(blocks_per_strip: Sequence[int], num_devices: int, local: int) -> str:
    """TorchRec's name for a table cut into column strips of these row block counts."""
    if len(blocks_per_strip) == 1:
        blocks = blocks_per_strip[0]
        if blocks == 1:
            return "table_wise"
        return "table_row_wise" if blocks == local < num_devices else "row_wise"
    return "column_wise" if max(blocks_per_strip) == 1 else "grid_shard"


class DeviceTimer(Protocol):
    """What the measured loop times devices with (``costmodels.samples.timing.time_devices``
    on real kernels; a fake in tests). Each device is a list of shards run as one fused
    kernel; the result is, per device, its time in each timed pass (ms; empty for a device
    without shards), and a dict saying how the run was made."""

    def __call__(self, devices: Sequence[Sequence["Shard"]], tables: "TableSet", **options) -> tuple[list[list[float]], dict]:
        ...
