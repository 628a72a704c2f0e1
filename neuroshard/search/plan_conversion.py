"""Plans to the simulator's pieces and back: a plan's shards as pieces of its tables and
their devices, placed pieces as plan shards, a candidate's estimate as the plan file's
``estimate`` object, and the simulator settings a plan states.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..plan import Plan, Shard
from ..tables import TableSet
from ..tiers import IN_DEVICE_MEMORY, Tier
from ..types import Estimate, Piece


def pieces_of_plan(tables: TableSet, plan: Plan) -> tuple[list[Piece], np.ndarray]:
    """A plan's shards as pieces of ``tables``, and their devices."""
    index = {t.name: i for i, t in enumerate(tables)}
    pieces = [Piece(index[s.table], s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in plan.shards]
    return pieces, np.array([s.device for s in plan.shards], dtype=np.int64)


def device_sets(tables: TableSet, plan: Plan) -> list[list[Piece]]:
    """The plan's pieces on each device (an empty list for an idle device)."""
    pieces, where = pieces_of_plan(tables, plan)
    return [[p for p, d in zip(pieces, where) if d == device] for device in range(plan.num_devices)]


def to_shards(tables: TableSet, tiers: Sequence[Tier] | None, pieces: Sequence[Piece], devices: np.ndarray
              ) -> list[Shard]:
    """Pieces placed on devices as plan shards, ordered by table, rows, columns, each in its
    table's tier (``tiers`` None: all in device memory)."""
    names = [t.name for t in tables]
    placed = sorted(zip(pieces, np.asarray(devices).tolist()))
    tiers = tiers or [IN_DEVICE_MEMORY] * len(names)
    return [Shard(names[p.table], p.row_offset, p.num_rows, p.col_offset, p.num_cols, int(d), tiers[p.table])
            for p, d in placed]


def plan_estimate(estimate: Estimate, index: int, batch_size: int, bound_ms: float) -> dict:
    """The plan file's ``estimate`` object of candidate ``index``: its costs, the batch size
    they are for, and the balanced bound ``bound_ms`` with the plan's ratio to it."""
    record = estimate.to_dict(index)
    record["batch_size"] = batch_size
    record["balanced_bound_ms"] = round(bound_ms, 6)
    record["ratio_to_balanced_bound"] = round(record["max_device_cost_ms"] / bound_ms, 4) if bound_ms > 0 else None
    return record


def simulator_settings(plan: Plan, tables: TableSet | None = None, batch_size: int | None = None
                       ) -> tuple[TableSet, dict[str, Any]]:
    """(tables, keyword arguments of ``Simulator``) of a plan: its weights and communication
    precision, optimizer, topology, tiers and row blocks (``provenance.row_blocks``), over
    ``tables`` (default: the plan's own) at ``batch_size`` (default: the tables' batch)."""
    tables = tables if tables is not None else TableSet(plan.tables_name, list(plan.tables))
    if batch_size:
        tables = tables.at_batch(batch_size)
    tiers = plan.tiers() if plan.tiered else None
    return tables, dict(bytes_per_element=plan.bytes_per_element, optimizer=plan.optimizer,
                        comm_precision=plan.comm_precision, topology=plan.topology,
                        tiers=None if tiers is None else [tiers[t.name] for t in tables], row_blocks=plan.row_blocks)
