"""Sharding plans: ``Shard``, ``Plan`` and the ``neuroshard.plan/v1`` file."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .constants import DATA_PARALLEL, DEFAULT_ROW_BLOCKS, FP32_BYTES, MEMORY_TIERS, SHIPPED_CHECKPOINTS, precision_of
from .constraints import plan_problems as constraint_problems
from .errors import FormatError, InvalidPlanError, NeuroShardError
from .io import atomic_write_text
from .optimizers import DEFAULT_OPTIMIZER, OPTIMIZERS, check_optimizer
from .provenance import Provenance
from .tables import Table, TableSet
from .tiers import IN_DEVICE_MEMORY, Tier
from .topology import Topology, ranks_per_host
from .types import layout_kind
from .units import format_bytes
from .validate import (
    COMM_PRECISIONS,
    MAX_BYTES_PER_ELEMENT,
    MAX_DEVICES,
    MAX_MEMORY_BYTES,
    MAX_TABLES,
    check_format,
    check_name,
    is_int,
    is_number,
    read_json,
)

PLAN_FORMAT = "neuroshard.plan/v1"
_SHARD_KEYS = ("table", "row_offset", "num_rows", "col_offset", "num_cols", "device")
_PLAN_KEYS = ("format", "tables_name", "num_devices", "device_memory_bytes", "bytes_per_element",
              "tables", "shards", "estimate", "provenance", "optimizer", "data_parallel_tables",
              "comm_precision", "topology")


@dataclass(frozen=True)
class Shard:
    """The rectangle [row_offset, row_offset+num_rows) x [col_offset, col_offset+num_cols)
    of one table, placed on one device."""

    table: str
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int
    device: int
    tier: Tier = IN_DEVICE_MEMORY  # where its rows live (``neuroshard.tiers``): device memory unless said

    def size_bytes(self, bytes_per_element: int = FP32_BYTES, optimizer: str = DEFAULT_OPTIMIZER) -> int:
        """Device memory of the shard: weights plus ``optimizer``'s state (``optimizers.shard_bytes``),
        or for rows in host memory or on SSD its device cache (``Tier.device_bytes``)."""
        return self.tier.device_bytes(self.num_rows, self.num_cols, bytes_per_element, optimizer)

    def backing_bytes(self, bytes_per_element: int = FP32_BYTES, optimizer: str = DEFAULT_OPTIMIZER) -> int:
        """Host-memory or SSD bytes of the shard (0 in device memory)."""
        return self.tier.backing_bytes(self.num_rows, self.num_cols, bytes_per_element, optimizer)

    def to_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in _SHARD_KEYS}, **self.tier.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Shard":
        if not isinstance(data, Mapping):
            raise FormatError(f"{where}: must be an object")
        if not isinstance(data.get("table"), str):
            raise FormatError(f"{where}: field 'table' must be a table name, got {data.get('table')!r}")
        for key in _SHARD_KEYS[1:]:
            if key not in data:
                raise FormatError(f"{where} (table '{data['table']}'): field '{key}' is missing")
            low = 1 if key in ("num_rows", "num_cols") else 0
            if not (is_int(data[key]) and data[key] >= low):
                raise FormatError(f"{where} (table '{data['table']}'): field '{key}' must be an integer >= {low}, "
                                  f"got {data[key]!r}")
        return cls(*(data[k] for k in _SHARD_KEYS), Tier.from_dict(data, f"{where} (table '{data['table']}')"))


@dataclass
class Plan:
    """Where every part of every table lives: shards over ``num_devices`` devices of
    ``device_memory_bytes`` each."""

    tables: list[Table]
    shards: list[Shard]
    num_devices: int
    device_memory_bytes: int
    bytes_per_element: int = FP32_BYTES
    tables_name: str = "tables"
    estimate: dict | None = None
    provenance: Provenance | None = None  # a dict given is read as the record
    extra: dict = field(default_factory=dict, repr=False)
    optimizer: str = DEFAULT_OPTIMIZER  # embedding optimizer: its state counts in memory (``optimizers``)
    data_parallel_tables: list[str] = field(default_factory=list)  # replicated on every device, no shards
    comm_precision: str = "fp32"  # element type the pooled-embedding all-to-all sends (COMM_PRECISIONS)
    topology: Topology | None = None  # hosts, links, per-device memory and speed (None: identical, one network)

    def __post_init__(self) -> None:
        if self.provenance is not None and not isinstance(self.provenance, Provenance):
            self.provenance = Provenance.from_dict(self.provenance, f"plan '{self.tables_name}'")

    # ---------------------------------------------------------------- access
    def table(self, name: str) -> Table:
        key = (id(self.tables), len(self.tables))
        if getattr(self, "_tables_key", None) != key:  # by name, built once per table list
            self._by_name, self._tables_key = {t.name: t for t in reversed(self.tables)}, key
        return self._by_name[name]

    def _shard_index(self) -> tuple[dict[str, list[Shard]], dict[int, list[Shard]]]:
        """Shards by table and by device, built once per shard list (a plan of 100,000 tables
        is not scanned once per table)."""
        key = (id(self.shards), len(self.shards))
        if getattr(self, "_index_key", None) != key:
            by_table: dict[str, list[Shard]] = {}
            by_device: dict[int, list[Shard]] = {}
            for s in self.shards:
                by_table.setdefault(s.table, []).append(s)
                by_device.setdefault(s.device, []).append(s)
            self._index, self._index_key = (by_table, by_device), key
        return self._index

    def layout_key(self) -> tuple:
        """What makes two plans of the same tables the same plan (hashable): their shards and
        their replicated tables. Refine, the demo and the plan benchmark time such plans once."""
        return tuple(self.shards), tuple(self.data_parallel_tables or ())

    def shards_of(self, table: str) -> list[Shard]:
        return list(self._shard_index()[0].get(table, ()))

    def shards_on(self, device: int) -> list[Shard]:
        return list(self._shard_index()[1].get(device, ()))

    def replicas(self) -> list[Shard]:
        """The data-parallel tables as one whole-table shard on every device (what they take
        in memory: the full table everywhere)."""
        return [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, d) for t in self.tables
                if t.name in self.data_parallel_tables for d in range(self.num_devices)]

    def memory_limits(self) -> list[int]:
        """Memory of every device: the topology's per-device list, else ``device_memory_bytes``."""
        if self.topology is not None and self.topology.device_memory_bytes is not None:
            return list(self.topology.device_memory_bytes)
        return [self.device_memory_bytes] * self.num_devices

    def memory_used_bytes(self) -> list[int]:
        """Device memory every device uses (weights, optimizer state, caches, replicas)."""
        used = [0] * self.num_devices
        for s in self.shards + self.replicas():
            if 0 <= s.device < self.num_devices:
                used[s.device] += s.size_bytes(self.bytes_per_element, self.optimizer)
        return used

    def tiers(self) -> dict[str, Tier]:
        """Each table's tier (its first shard's; data-parallel tables are in device memory)."""
        out = {t.name: IN_DEVICE_MEMORY for t in self.tables}
        for s in reversed(self.shards):
            if s.table in out:
                out[s.table] = s.tier
        return out

    @property
    def tiered(self) -> bool:
        """Whether any shard's rows live in host memory or on SSD."""
        return any(not s.tier.on_device for s in self.shards)

    def backing_used_bytes(self, memory: str) -> list[int]:
        """Bytes of the ``host`` or ``ssd`` tier every host uses (hosts: ``Topology.tier_host_of``)."""
        topology = self.topology or Topology(self.num_devices)
        host_of = topology.tier_host_of()
        used = [0] * (int(host_of.max()) + 1)
        for s in self.shards:
            if s.tier.memory == memory and 0 <= s.device < self.num_devices:
                used[int(host_of[s.device])] += s.backing_bytes(self.bytes_per_element, self.optimizer)
        return used

    @property
    def row_blocks(self) -> str:
        """Which row splits the plan's search could make (``provenance.row_blocks``; without it,
        TorchRec's layouts: ``constants.DEFAULT_ROW_BLOCKS``)."""
        return (self.provenance or {}).get("row_blocks") or DEFAULT_ROW_BLOCKS

    @property
    def local_world_size(self) -> int:
        """Ranks per host (``topology.ranks_per_host``)."""
        return ranks_per_host(self.topology, self.num_devices)

    def sharding_type(self, table: str) -> str:
        """TorchRec's name of the table's layout (``types.layout_kind``, the one classifier):
        'table_wise', 'column_wise', 'row_wise', 'table_row_wise', 'grid_shard' (column strips
        cut into row blocks), or 'data_parallel' (replicated)."""
        if table in self.data_parallel_tables:
            return DATA_PARALLEL
        strips: dict[tuple[int, int], int] = {}
        for s in self.shards_of(table):
            strips[(s.col_offset, s.num_cols)] = strips.get((s.col_offset, s.num_cols), 0) + 1
        bounds = sorted(strips)
        if any(a[0] + a[1] > b[0] for a, b in zip(bounds, bounds[1:])):
            return "grid_shard"  # split along both, but not in column strips (an irregular grid TorchRec refuses)
        return layout_kind([strips[k] for k in bounds], self.num_devices, self.local_world_size)

    # ------------------------------------------------------------ validation
    def problems(self) -> list[str]:
        """Everything that makes this plan invalid, one sentence each (empty when valid)."""
        out: list[str] = []
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            out.append("the plan lists a table twice")
        by_table: dict[str, list[Shard]] = {n: [] for n in names}
        for i, s in enumerate(self.shards):
            if s.table not in by_table:
                out.append(f"shard #{i}: table '{s.table}' is not among the plan's tables")
                continue
            if not 0 <= s.device < self.num_devices:
                out.append(f"shard #{i} of table '{s.table}': device {s.device} is outside 0..{self.num_devices - 1}")
            by_table[s.table].append(s)
        replicated = set(self.data_parallel_tables)
        for name in sorted(replicated - set(names)):
            out.append(f"data-parallel table '{name}' is not among the plan's tables")
        if len(replicated) != len(self.data_parallel_tables):
            out.append("data_parallel_tables lists a table twice")
        for t in self.tables:
            if t.name not in replicated:
                out.extend(_tiling_problems(t, by_table[t.name]))
            elif by_table[t.name]:
                out.append(f"table '{t.name}' is data-parallel (replicated on every device) but also has "
                           f"{len(by_table[t.name])} shard(s)")
        if self.comm_precision not in COMM_PRECISIONS:
            out.append(f"unknown comm_precision {self.comm_precision!r} (choose from {', '.join(COMM_PRECISIONS)})")
        if self.optimizer not in OPTIMIZERS:
            return out + [f"unknown optimizer {self.optimizer!r} (choose from {', '.join(OPTIMIZERS)})"]
        state = "" if self.optimizer == DEFAULT_OPTIMIZER else f" with {self.optimizer} state"
        out.extend(_topology_problems(self))
        for d, (used, limit) in enumerate(zip(self.memory_used_bytes(), self.memory_limits())):
            if used > limit:
                out.append(f"device {d}: shards need {used} bytes{state}, over its {limit} by {used - limit}")
        out.extend(_tier_problems(self))
        if not out:  # a valid tiling: does it keep its tables' constraints?
            out.extend(constraint_problems(self))
        return out

    def validate(self) -> "Plan":
        """Raise InvalidPlanError naming every problem; return self when valid."""
        problems = self.problems()
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise InvalidPlanError("invalid plan: " + "; ".join(problems[:3]) + more)
        return self

    def check_matches(self, tables: TableSet) -> None:
        """Refuse a plan made for other tables than ``tables``."""
        mine = {t.name: t for t in self.tables}
        theirs = {t.name: t for t in tables}
        if set(mine) != set(theirs):
            missing = _first_names(set(theirs) - set(mine))
            unknown = _first_names(set(mine) - set(theirs))
            raise InvalidPlanError(f"plan does not match tables '{tables.name}': tables not in plan {missing}, "
                                   f"plan tables not in file {unknown}")
        for name, t in mine.items():
            o = theirs[name]
            if (t.num_embeddings, t.embedding_dim) != (o.num_embeddings, o.embedding_dim):
                raise InvalidPlanError(f"plan does not match tables '{tables.name}': table '{name}' is "
                                       f"{t.num_embeddings}x{t.embedding_dim} in the plan, "
                                       f"{o.num_embeddings}x{o.embedding_dim} in the file")

    # ---------------------------------------------------------------- format
    @classmethod
    def from_dict(cls, data: Any, source: str = "<plan>") -> "Plan":
        if not isinstance(data, Mapping):
            raise FormatError(f"{source}: a plan file must be a JSON object")
        check_format(data, PLAN_FORMAT, source)
        for key, high, limit in (("num_devices", MAX_DEVICES, "MAX_DEVICES"),
                                 ("device_memory_bytes", MAX_MEMORY_BYTES, "MAX_MEMORY_BYTES")):
            if key not in data:
                raise FormatError(f"{source}: field '{key}' is missing")
            if not (is_int(data[key]) and 1 <= data[key] <= high):
                raise FormatError(f"{source}: field '{key}' must be an integer in [1, {high}] ({limit}), "
                                  f"got {data[key]!r}")
        bpe = data.get("bytes_per_element", 4)
        if not (is_int(bpe) and 1 <= bpe <= MAX_BYTES_PER_ELEMENT):
            raise FormatError(f"{source}: field 'bytes_per_element' must be an integer in "
                              f"[1, {MAX_BYTES_PER_ELEMENT}], got {bpe!r}")
        if not isinstance(data.get("tables"), list) or not data["tables"]:
            raise FormatError(f"{source}: field 'tables' must be a non-empty list")
        if len(data["tables"]) > MAX_TABLES:
            raise FormatError(f"{source}: {len(data['tables'])} tables, over the limit of {MAX_TABLES} (MAX_TABLES)")
        if not isinstance(data.get("shards"), list):
            raise FormatError(f"{source}: field 'shards' must be a list")
        tables = [Table.from_dict(t, where=f"{source}: table #{i}") for i, t in enumerate(data["tables"])]
        shards = [Shard.from_dict(s, where=f"{source}: shard #{i}") for i, s in enumerate(data["shards"])]
        for key in ("estimate", "provenance"):
            if data.get(key) is not None and not isinstance(data[key], Mapping):
                raise FormatError(f"{source}: field '{key}' must be an object")
        estimate = data.get("estimate") or {}
        if "max_device_cost_ms" in estimate and not is_number(estimate["max_device_cost_ms"]):
            raise FormatError(f"{source}: field 'estimate.max_device_cost_ms' must be a number, "
                              f"got {estimate['max_device_cost_ms']!r}")
        costs = estimate.get("per_device_cost_ms")
        if costs is not None and not (isinstance(costs, list) and all(is_number(c) for c in costs)):
            raise FormatError(f"{source}: field 'estimate.per_device_cost_ms' must be a list of numbers")
        try:
            optimizer = check_optimizer(data.get("optimizer", DEFAULT_OPTIMIZER), f"{source}: field 'optimizer'")
        except NeuroShardError as exc:
            raise FormatError(str(exc)) from None
        replicated = data.get("data_parallel_tables", [])
        if not (isinstance(replicated, list) and all(isinstance(n, str) for n in replicated)):
            raise FormatError(f"{source}: field 'data_parallel_tables' must be a list of table names, "
                              f"got {replicated!r}")
        comm_precision = data.get("comm_precision", "fp32")
        if comm_precision not in COMM_PRECISIONS:
            raise FormatError(f"{source}: field 'comm_precision' must be one of {', '.join(COMM_PRECISIONS)}, "
                              f"got {comm_precision!r}")
        topology = None
        if data.get("topology") is not None:
            topology = Topology.from_dict(data["topology"], data["num_devices"], f"{source}: field 'topology'")
            if topology.device_memory_bytes is not None and max(topology.device_memory_bytes) != data["device_memory_bytes"]:
                raise FormatError(f"{source}: field 'device_memory_bytes' must be the largest entry of "
                                  f"'topology.device_memory_bytes' ({max(topology.device_memory_bytes)}), "
                                  f"got {data['device_memory_bytes']}")
        extra = {k: v for k, v in data.items() if k not in _PLAN_KEYS}
        return cls(tables, shards, data["num_devices"], data["device_memory_bytes"], bpe,
                   check_name(data.get("tables_name", "tables"), source, "tables_name", empty=True), data.get("estimate"),
                   None if data.get("provenance") is None else Provenance.from_dict(data["provenance"], source), extra,
                   optimizer=optimizer, data_parallel_tables=list(replicated), comm_precision=comm_precision,
                   topology=topology)

    def to_dict(self) -> dict:
        out: dict = {"format": PLAN_FORMAT, "tables_name": self.tables_name, "num_devices": self.num_devices,
                     "device_memory_bytes": self.device_memory_bytes, "bytes_per_element": self.bytes_per_element,
                     "tables": [t.to_dict() for t in self.tables],
                     "shards": [s.to_dict() for s in self.shards]}
        if self.optimizer != DEFAULT_OPTIMIZER:  # absent at the default: the plan reads as one without the field
            out["optimizer"] = self.optimizer
        if self.data_parallel_tables:  # absent when none: the plan reads as one without the field
            out["data_parallel_tables"] = list(self.data_parallel_tables)
        if self.comm_precision != "fp32":  # absent at fp32: the plan reads as one without the field
            out["comm_precision"] = self.comm_precision
        if self.topology is not None:  # absent without one: the plan reads as one without the field
            out["topology"] = self.topology.to_dict()
        if self.estimate is not None:
            out["estimate"] = self.estimate
        if self.provenance is not None:
            out["provenance"] = self.provenance.to_dict()
        out.update(self.extra)
        return out

    @classmethod
    def read(cls, path: str | Path) -> "Plan":
        path = Path(path)
        return cls.from_dict(read_json(path, "plan file"), source=str(path))

    @classmethod
    def read_checked(cls, path: str | Path, tables: TableSet | None = None) -> "Plan":
        """The one check every command that uses a plan runs first: the file reads as a plan
        (``FormatError``), the plan is valid (``InvalidPlanError`` naming the file and its
        problems) and, given ``tables``, was made for them."""
        plan = cls.read(path)
        try:
            plan.validate()
        except InvalidPlanError as exc:
            raise InvalidPlanError(f"{path}: {exc}") from None
        if tables is not None:
            plan.check_matches(tables)
        return plan

    def is_placed(self) -> bool:
        """Whether every shard sits on a table the plan lists and a device it has, and every
        table is sharded or replicated: what a per-device view of the plan needs. A placed
        plan may still be invalid (a row in no shard, a device over its memory)."""
        names = {t.name for t in self.tables}
        sharded = {s.table for s in self.shards}
        return (all(s.table in names and 0 <= s.device < self.num_devices for s in self.shards)
                and names <= sharded | set(self.data_parallel_tables))

    def write(self, path: str | Path) -> Path:
        """Validate, then write atomically: an invalid plan never leaves the tool."""
        self.validate()
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    # --------------------------------------------------------------- summary
    def summary(self):
        """Per-device table (pandas): memory used/limit, shards, total width, lookups per
        sample, and the estimated cost when the plan carries one."""
        import pandas as pd
        by_name = {t.name: t for t in self.tables}
        rows = []
        costs = (self.estimate or {}).get("per_device_cost_ms")
        memory = self.memory_used_bytes()
        limits = self.memory_limits()
        for d in range(self.num_devices):
            shards = self.shards_on(d)
            used = memory[d]  # data-parallel tables included
            lookups = sum(by_name[s.table].pooling_factor * s.num_rows / by_name[s.table].num_embeddings
                          for s in shards if s.table in by_name)
            row = {"device": d, "shards": len(shards), "tables": len({s.table for s in shards}),
                   "width": sum(s.num_cols for s in shards), "lookups/sample": round(lookups, 2),
                   "memory_used": used, "memory_limit": limits[d],
                   "memory_%": round(100.0 * used / limits[d], 1)}
            if costs is not None and d < len(costs):
                row["cost_ms"] = round(float(costs[d]), 3)
                compute = (self.estimate or {}).get("per_device_compute_ms")
                if compute is not None and d < len(compute):  # the cost = compute + the rest (exchange, waiting)
                    row["compute_ms"] = round(float(compute[d]), 3)
                    row["comm_ms"] = round(float(costs[d]) - float(compute[d]), 3)
            rows.append(row)
        return pd.DataFrame(rows)

    def format_tiers(self) -> str:
        """Which tables live outside device memory, and what each tier holds per host."""
        groups: dict[str, list[str]] = {}
        for name, tier in self.tiers().items():
            if not tier.on_device:
                groups.setdefault(tier.label(), []).append(name)
        lines = ["memory tiers (tables outside device memory):"]
        lines += [f"  {label}: {len(names)} table{'s' if len(names) > 1 else ''} "
                  f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
                  for label, names in sorted(groups.items())]
        for memory, what in (("host", "host memory"), ("ssd", "SSD")):
            used = self.backing_used_bytes(memory)
            if any(used):
                capacity = None if self.topology is None else self.topology.capacity(memory)
                of = f" of {format_bytes(capacity)}" if capacity is not None else ""
                lines.append(f"  {what} used per host: {', '.join(format_bytes(u) for u in used)}{of}")
        return "\n".join(lines)

    def format_shards(self) -> str:
        """Which table (and which rows and columns of it) is on which device, one line per device."""
        lines = []
        for d in range(self.num_devices):
            parts = []
            for s in sorted(self.shards_on(d), key=lambda s: (s.table, s.col_offset, s.row_offset)):
                table = self.table(s.table)
                text = s.table
                if s.num_rows != table.num_embeddings:
                    text += f" rows {s.row_offset:,}-{s.row_offset + s.num_rows - 1:,}"
                if s.num_cols != table.embedding_dim:
                    text += f" cols {s.col_offset}-{s.col_offset + s.num_cols - 1}"
                if not s.tier.on_device:
                    text += f" [{s.tier.label()}]"
                parts.append(text)
            lines.append(f"device {d}: " + (", ".join(parts) if parts else "(idle)"))
        if self.data_parallel_tables:
            lines.append("every device: " + ", ".join(self.data_parallel_tables) + " (replicated)")
        return "\n".join(lines)

    def format_splits(self) -> str | None:
        """Why each split table was split (``provenance.splits``, ``SPLIT_REASONS``), one line per
        reason; None when the plan splits no table."""
        split = [t.name for t in self.tables if len(self.shards_of(t.name)) > 1]
        if not split:
            return None
        recorded = (self.provenance or {}).get("splits") or {}
        groups: dict[str, list[str]] = {}
        for name in split:
            groups.setdefault(recorded.get(name, ""), []).append(name)
        lines = ["why tables are split:"]
        for reason in (*SPLIT_REASONS, ""):
            names = groups.get(reason)
            if names:
                shown = ", ".join(names[:8]) + (f", ... ({len(names)} tables)" if len(names) > 8 else "")
                lines.append(f"  {reason or 'not recorded'}"
                             f"{' (' + SPLIT_REASONS[reason] + ')' if reason else ''}: {shown}")
        return "\n".join(lines)

    def format_bound(self) -> str | None:
        """The estimate's balanced bound and the plan's ratio to it, in words (None without one)."""
        est = self.estimate or {}
        if est.get("ratio_to_balanced_bound") is None:
            return None
        return (f"balanced bound: {est['balanced_bound_ms']:.3f} ms, the tables' costs alone summed and spread "
                f"evenly over {self.num_devices} devices (no communication); the slowest device here is "
                f"{est['ratio_to_balanced_bound']:.3f}x that. Above 1: communication and waiting, and tables "
                f"that do not divide evenly; below 1 is possible, as tables fused on one device cost less "
                f"together than alone")

    def _estimate_basis(self) -> str:
        """What the estimate is for: its batch, then the source of each term (``estimate_sources``)."""
        batch = (self.estimate or {}).get("batch_size")
        text = f" at batch {batch:,} (all devices together)" if isinstance(batch, int) else ""
        return text + "".join(f"\n  {line}" for line in self.estimate_sources())

    def estimate_sources(self) -> list[str]:
        """The estimate's terms and where each comes from, one line each, for a person: compute
        (which cost model, measured on which hardware, at which batch), the exchange (measured
        with that model, or analytic over which links), the tiers' traffic, and whose machine
        the figure describes; then a warning line when the terms describe different machines
        or the batch is over ``FAR_BATCH_FACTOR`` away from the one the models were measured at.
        Empty for a plan without a cost model in its provenance (an imported TorchRec plan)."""
        return estimate_sources(self.provenance or {}, self.estimate or {})

    def format_summary(self) -> str:
        """The per-device table as text, with a header line a person reads at a glance."""
        df = self.summary()
        df["memory_used"] = df["memory_used"].map(format_bytes)
        df["memory_limit"] = df["memory_limit"].map(format_bytes)
        kinds: dict[str, int] = {}
        for t in self.tables:
            kind = self.sharding_type(t.name)
            kinds[kind] = kinds.get(kind, 0) + 1
        algo = (self.provenance or {}).get("algorithm", "?")
        head = (f"plan for '{self.tables_name}': {len(self.tables)} tables, {len(self.shards)} shards "
                f"on {self.num_devices} devices (algorithm: {algo}; "
                + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")")
        if self.optimizer != DEFAULT_OPTIMIZER:
            head += f"\noptimizer: {self.optimizer} (memory_used counts its state with the weights)"
        if self.data_parallel_tables:
            head += (f"\ndata-parallel tables (replicated on every device, in memory_used): "
                     f"{', '.join(self.data_parallel_tables)}")
        if self.bytes_per_element != FP32_BYTES:
            head += f"\nweights precision: {precision_of(self.bytes_per_element)} ({self.bytes_per_element} bytes per element)"
        if self.comm_precision != "fp32":
            head += f"\ncommunication precision: {self.comm_precision} (pooled embeddings and gradients, all-to-all)"
        if self.topology is not None:
            head += f"\ntopology: {self.topology.describe()}"
        if self.tiered:
            head += "\n" + self.format_tiers()
        if self.estimate and "max_device_cost_ms" in self.estimate:
            head += f"\nestimated max device cost: {self.estimate['max_device_cost_ms']:.3f} ms/iteration"
            head += self._estimate_basis()
        return head + "\n" + df.to_string(index=False)


#: why a table was split (``provenance.splits``, written by ``search.api.split_reasons``), in words
SPLIT_REASONS = {
    "memory": "larger than a device, or its pieces fit the devices no other way",
    "constraints": "the layout its constraints in the tables file ask for",
    "balance": "costlier alone than half a device's even share of the work, the balanced bound",
    "cost": "the cost models estimated the plan cheaper with it split",
}
#: a batch this many times larger or smaller than the cost models' measured batch is an
#: extrapolation of their linear scaling the estimate warns about
FAR_BATCH_FACTOR = 4.0
_ANALYTIC_DEFAULTS = "unfitted analytic defaults"  # the hardware note of ``analytic_cost_models``


def _compute_source(prov: Mapping) -> str:
    """Where the compute model comes from, in a few words: this machine, the shipped
    checkpoint, a user's file, or unfitted defaults."""
    name, path = str(prov.get("cost_model", "")), prov.get("cost_model_path")
    if name.startswith("this machine"):
        return "pre-trained on this machine"
    if prov.get("cost_model_hardware") == _ANALYTIC_DEFAULTS:
        return _ANALYTIC_DEFAULTS
    if path and Path(str(path)).parent == SHIPPED_CHECKPOINTS:
        return "shipped with neuroshard"
    return f"from {path}" if path else ""


def estimate_sources(prov: Mapping, estimate: Mapping) -> list[str]:
    """``Plan.estimate_sources`` of a plan's ``provenance`` and ``estimate``."""
    name, hardware = prov.get("cost_model"), str(prov.get("cost_model_hardware") or "")
    if not name:
        return []
    scored = estimate.get("cost_model")
    if scored and scored != name:  # re-scored (``plan score``) by models the provenance does not describe
        return [f"by cost model '{scored}' (scored after the search: its hardware is not in the plan)"]
    batch, measured = estimate.get("batch_size"), prov.get("cost_model_batch_size")
    source = _compute_source(prov)
    compute = f"compute by cost model '{name}'" + (f" ({source})" if source else "")
    if hardware and hardware != _ANALYTIC_DEFAULTS:
        compute += f", measured on {hardware}"
    if isinstance(measured, int):
        compute += f" at batch {measured:,}"
        if isinstance(batch, int) and batch != measured:
            compute += f", scaled linearly to {batch:,}"
    lines = [compute]
    comm = str(prov.get("comm_model") or "")
    analytic = comm.startswith("analytic")
    if analytic:
        lines.append("exchange " + comm)
    elif comm.startswith("measured: "):
        lines.append(f"exchange by {comm[len('measured: '):]}, measured with the compute on the same hardware")
    tiers = prov.get("tiers")
    if isinstance(tiers, dict) and tiers.get("model"):
        lines.append(f"host-memory and SSD traffic {tiers['model']}")
    here = source == "pre-trained on this machine"
    calibrated = "calibrated on " in hardware
    links = " over the links above" if analytic else ""
    if source == _ANALYTIC_DEFAULTS:
        lines.append("an estimate from unfitted defaults, for no machine in particular")
    elif here:
        lines.append(f"an estimate for this machine{links}")
    elif calibrated:
        lines.append(f"an estimate for the machine it was calibrated on{links}")
    else:
        lines.append("an estimate for that hardware, not yours until calibrated or measured there")
    if analytic and hardware and not (here or calibrated or source == _ANALYTIC_DEFAULTS):
        over = comm.split("bytes over ", 1)[-1].split(": ", 1)[0]
        lines.append(f"warning: the terms describe different machines: compute measured on {hardware}, the "
                     f"exchange {over}; calibrate on the machine you will train on (--calibrate) or pre-train "
                     f"there (neuroshard pretrain --here)")
    if isinstance(batch, int) and isinstance(measured, int) and measured > 0:
        ratio = batch / measured
        if ratio > FAR_BATCH_FACTOR or ratio < 1 / FAR_BATCH_FACTOR:
            lines.append(f"warning: batch {batch:,} is {ratio:.3g}x the batch the cost model was measured at "
                         f"({measured:,}): its linear scaling is an extrapolation that far")
    return lines


def _topology_problems(plan: Plan) -> list[str]:
    """A topology that does not describe the plan's devices."""
    topo = plan.topology
    if topo is None:
        return []
    if topo.num_devices != plan.num_devices:
        return [f"the topology has {topo.num_devices} devices, the plan {plan.num_devices}"]
    if topo.device_memory_bytes is not None and max(topo.device_memory_bytes) != plan.device_memory_bytes:
        return [f"device_memory_bytes ({plan.device_memory_bytes}) is not the largest per-device memory of the "
                f"topology ({max(topo.device_memory_bytes)})"]
    return []


def _tier_problems(plan: Plan) -> list[str]:
    """Tables whose shards are in different tiers, and tiers over capacity or not stated."""
    out = []
    by_table: dict[str, set[Tier]] = {}
    for s in plan.shards:
        by_table.setdefault(s.table, set()).add(s.tier)
    for name, tiers in by_table.items():
        if len(tiers) > 1:
            out.append(f"table '{name}': its shards are in different memory tiers "
                       f"({', '.join(sorted(t.label() for t in tiers))}); TorchRec runs one kernel per table")
    for memory in MEMORY_TIERS[1:]:
        used = plan.backing_used_bytes(memory)
        if not any(used):
            continue
        capacity = None if plan.topology is None else plan.topology.capacity(memory)
        flag = "--host-memory" if memory == "host" else "--ssd"
        what = "host memory" if memory == "host" else "SSD"
        if capacity is None:
            out.append(f"shards keep rows in {what}, but the plan's topology states no {what} "
                       f"(topology field '{'host_memory_bytes' if memory == 'host' else 'ssd_bytes'}', {flag})")
            continue
        for h, u in enumerate(used):
            if u > capacity:
                out.append(f"host {h}: shards keep {u} bytes in {what}, over its {capacity} by {u - capacity}")
    return out


def _tiling_problems(table: Table, shards: Sequence[Shard]) -> list[str]:
    """Gaps, overlaps and out-of-bounds shards of one table."""
    name = table.name
    if not shards:
        return [f"table '{name}' has no shard"]
    out = []
    for s in shards:
        if s.row_offset + s.num_rows > table.num_embeddings or s.col_offset + s.num_cols > table.embedding_dim:
            out.append(f"table '{name}': shard rows [{s.row_offset}, {s.row_offset + s.num_rows}) x cols "
                       f"[{s.col_offset}, {s.col_offset + s.num_cols}) lies outside the table's "
                       f"{table.num_embeddings} x {table.embedding_dim}")
    if out:
        return out
    # Coordinate-compressed coverage grid: every cell must be covered exactly once.
    row_cuts = sorted({0, table.num_embeddings} | {s.row_offset for s in shards} | {s.row_offset + s.num_rows for s in shards})
    col_cuts = sorted({0, table.embedding_dim} | {s.col_offset for s in shards} | {s.col_offset + s.num_cols for s in shards})
    cover = np.zeros((len(row_cuts) - 1, len(col_cuts) - 1), dtype=np.int32)
    for s in shards:
        r0, r1 = np.searchsorted(row_cuts, [s.row_offset, s.row_offset + s.num_rows])
        c0, c1 = np.searchsorted(col_cuts, [s.col_offset, s.col_offset + s.num_cols])
        cover[r0:r1, c0:c1] += 1
    for what, mask in (("not covered by any shard", cover == 0), ("covered by more than one shard", cover > 1)):
        if mask.any():
            i, j = map(int, np.argwhere(mask)[0])
            out.append(f"table '{name}': rows [{row_cuts[i]}, {row_cuts[i + 1]}) x cols "
                       f"[{col_cuts[j]}, {col_cuts[j + 1]}) {what}")
    return out


def _first_names(names: set[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names`` in order, and how many more: ``['a', 'b', 'c'] (and 4 more)``."""
    ordered = sorted(names)
    more = f" (and {len(ordered) - shown} more)" if len(ordered) > shown else ""
    return f"{ordered[:shown]}{more}"
