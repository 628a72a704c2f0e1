"""The simulator's storage rules: what a piece takes in device memory, and where pieces may go.

``Storage`` holds what decides whether a placement fits and is allowed, never what it
costs (``performance``): each table's memory tier (``neuroshard.tiers``: what its pieces
take in device memory, ``footprint``), the optimizer state that counts in every memory
check, the tables replicated on every device (data-parallel: they leave the pieces and
take ``replicated_bytes`` on every device), the tables' constraints (layout, shard counts,
pinned devices: ``neuroshard.constraints``) and the tables split before any algorithm runs
(``memory_split``).
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from ..constraints import TableConstraints, allowed_state, conform, device_mask
from ..errors import NeuroShardError
from ..optimizers import DEFAULT_OPTIMIZER, tables_bytes
from ..tables import TableSet
from ..tiers import Tier, device_bytes_array
from ..topology import Topology, device_memory
from ..types import Footprint, Piece, whole_pieces
from .rowwise import split_for_memory


class Storage:
    """Memory and placement rules of ``tables`` on ``num_devices`` devices.

    ``local_world_size`` and ``row_block_counts`` are the host size and row block counts
    the constraints and row splits follow (``Simulator``); ``constraints`` is
    ``constraints.table_constraints(tables)``."""

    def __init__(self, tables: TableSet, num_devices: int, bytes_per_element: int, optimizer: str, *,
                 topology: Topology | None, local_world_size: int, row_block_counts: Sequence[int],
                 constraints: list[TableConstraints] | None, tiers: Sequence[Tier] | None = None,
                 data_parallel_tables: Sequence[str] = ()):
        self.tables = tables
        self.num_devices = num_devices
        self.bytes_per_element = bytes_per_element
        self.optimizer = optimizer
        self.topology = topology
        self.local_world_size = local_world_size
        self.row_block_counts = row_block_counts
        self.constraints = constraints  # per table, by index (None: no table has any)
        self._set_tiers(tiers)
        self._set_data_parallel(data_parallel_tables)

    # ---------------------------------------------------------------- tiers
    def _set_tiers(self, tiers: Sequence[Tier] | None) -> None:
        """Each table's memory tier (None: every table in device memory), and what its pieces
        take in device memory (``footprint``)."""
        if tiers is not None and len(tiers) != len(self.tables):
            raise NeuroShardError(f"{len(tiers)} tiers given for {len(self.tables)} tables")
        self.tiers = None if tiers is None or all(t.on_device for t in tiers) else tuple(tiers)
        self.footprint = Footprint(self.bytes_per_element, self.optimizer, self.tiers)
        self.tier_record: dict = {}  # how the tiers were chosen (``search.tiers``), for the provenance

    def with_tiers(self, tiers: Sequence[Tier] | None, record: dict | None = None) -> "Storage":
        """A copy with other tiers (``record``: how they were chosen)."""
        other = copy.copy(self)
        other._set_tiers(tiers)
        other.tier_record = dict(record or {})
        other._memory_splits = {}
        return other

    # ------------------------------------------------- data-parallel tables
    def _set_data_parallel(self, names: Sequence[str]) -> None:
        """Replicate the tables ``names`` on every device: they leave the pieces (``sharded_pieces``)."""
        unknown = sorted(set(names) - {t.name for t in self.tables})
        if unknown:
            raise NeuroShardError(f"data-parallel table '{unknown[0]}' is not among the tables")
        self.data_parallel_tables = tuple(t.name for t in self.tables if t.name in set(names))
        self.total_dim = sum(t.embedding_dim for t in self.tables if t.name not in self.data_parallel_tables)
        self._memory_splits: dict[tuple[int, bool], list[Piece]] = {}

    def with_data_parallel(self, names: Sequence[str]) -> "Storage":
        """A copy with ``names`` replicated on every device."""
        other = copy.copy(self)
        other._set_data_parallel(names)
        return other

    def sharded_pieces(self) -> list[Piece]:
        """One piece per table that is not replicated (table-wise)."""
        return [p for p in whole_pieces(self.tables) if self.tables[p.table].name not in self.data_parallel_tables]

    # --------------------------------------------------------------- memory
    def memory_limits(self, memory_bytes: int) -> int | np.ndarray:
        """What the placers compare with: ``memory_bytes``, or (D,) bytes per device when the
        topology gives per-device memory."""
        return device_memory(self.topology, memory_bytes)

    def sizes_bytes(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Device memory of pieces (``footprint``), as float64 for the placers."""
        return self.footprint.sizes(pieces)

    def bytes_array(self, pieces: np.ndarray) -> np.ndarray:
        """Device memory (weights and optimizer state) of pieces given as a (N, 5) array of
        ``Piece`` fields."""
        return device_bytes_array(self.tiers, pieces[:, 0], pieces[:, 2], pieces[:, 4], self.bytes_per_element,
                                  self.optimizer)

    def memory_split(self, memory_bytes: int, row_splits: bool = True) -> list[Piece]:
        """The tables as pieces, those larger than a device split (``rowwise.split_for_memory``,
        as many row blocks as TorchRec runs): computed once per memory and ``row_splits``
        (``search_plan()`` does it before any algorithm runs), a new list each call."""
        key = (int(np.max(memory_bytes)), bool(row_splits))  # per-device memory: split for the largest device
        if key not in self._memory_splits:
            self._memory_splits[key] = split_for_memory(self.sharded_pieces(), key[0], self.footprint, row_splits,
                                                        self.num_devices, counts=self.row_block_counts)
            if self.constraints is not None:
                self._memory_splits[key] = self._conform(self._memory_splits[key], memory_bytes, row_splits)
        return list(self._memory_splits[key])

    # ---------------------------------------------------------- constraints
    def _conform(self, pieces: list[Piece], memory_bytes: int, row_splits: bool) -> list[Piece]:
        """Each constrained table's pieces in an allowed layout that fits its (pinned) devices
        (``constraints.conform``)."""
        limits = memory_bytes if np.ndim(memory_bytes) else self.memory_limits(memory_bytes)
        limits = np.broadcast_to(np.asarray(limits, dtype=np.float64), (self.num_devices,))
        out: list[Piece] = []
        for t in sorted({p.table for p in pieces}):
            mine, rule = [p for p in pieces if p.table == t], self.constraints[t]
            if rule.any:
                pinned = list(rule.devices) if rule.devices is not None else slice(None)
                mine = conform(mine, self.tables[t], rule, float(limits[pinned].max()),
                               lambda cols, t=t: self.footprint.row_bytes(Piece(t, 0, 1, 0, cols)),
                               self.num_devices, self.local_world_size, row_splits)
            out += mine
        return sorted(out)

    def allowed(self, pieces: Sequence[Piece]) -> bool:
        """Whether every constrained table's pieces take a layout its constraints allow."""
        return allowed_state(pieces, self.constraints, self.num_devices, self.local_world_size)

    def device_mask(self, pieces: Sequence[Piece]) -> np.ndarray | None:
        """(pieces, devices): where each piece may go (pinned tables); None when none is pinned."""
        return device_mask(pieces, self.constraints, self.num_devices)

    def placement_rules(self, pieces: Sequence[Piece]) -> dict:
        """``greedy_place``'s constraint arguments for ``pieces``: where each may go (``allowed``)
        and which to place first (``first``: pieces of constrained tables); empty without constraints."""
        if self.constraints is None:
            return {}
        return {"allowed": self.device_mask(pieces),
                "first": np.array([self.constraints[p.table].any for p in pieces], dtype=bool)}

    def allows_placement(self, pieces: Sequence[Piece], devices: np.ndarray) -> bool:
        """Whether a finished placement keeps every table's constraints (layout, shard counts,
        pinned devices)."""
        if self.constraints is None:
            return True
        mask = self.device_mask(pieces)
        return (allowed_state(pieces, self.constraints, self.num_devices, self.local_world_size, final=True)
                and (mask is None or bool(mask[np.arange(len(pieces)), np.asarray(devices)].all())))


def replicated_bytes(sim: Any, names: Sequence[str]) -> int:
    """Memory every device gives to the replicated tables ``names`` (weights and optimizer
    state), for a ``Simulator`` (or its ``Storage``)."""
    return tables_bytes((t for t in sim.tables if t.name in names), sim.bytes_per_element,
                        getattr(sim, "optimizer", DEFAULT_OPTIMIZER))
