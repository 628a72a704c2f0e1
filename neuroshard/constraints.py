"""Per-table constraints: the ``constraints`` object of a table in the tables file.

``{"sharding_types": [...], "devices": [...], "min_shards": n, "max_shards": n}``, every
key optional:

* ``sharding_types``: the layouts the table may take, TorchRec's names (``SHARDING_TYPES``):
  ``table_wise`` (one shard), ``column_wise`` (column strips), ``row_wise`` (row blocks on
  all ranks), ``table_row_wise`` (row blocks on one host's ranks), ``grid_shard`` (column
  strips cut into row blocks), ``data_parallel`` (the table *may* be replicated on every
  device). Absent: any.
* ``devices``: the table's shards go only on these devices (pinned).
* ``min_shards`` / ``max_shards``: how many shards the table is cut into.

Every search algorithm honours them through three hooks: the memory split makes every
constrained table's starting layout allowed (``conform``), splitting moves keep to allowed
layouts (``allowed_state``) and placements to allowed devices (``device_mask``).
``Plan.problems`` reports a plan that breaks its tables' constraints (``plan_problems``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .constants import DATA_PARALLEL, SHARDING_TYPES, block_counts
from .errors import FormatError, InfeasibleError
from .optimizers import DEFAULT_OPTIMIZER, row_bytes, tables_bytes
from .types import Piece, layout_kind, narrowest_cols, split_rows
from .units import format_bytes
from .validate import is_int

if TYPE_CHECKING:
    from .plan import Plan
    from .tables import Table, TableSet

_KEYS = ("sharding_types", "devices", "min_shards", "max_shards")
#: layouts that split columns / rows (``data_parallel`` is not a shard layout)
_COLUMN_KINDS = {"column_wise", "grid_shard"}
_ROW_KINDS = {"row_wise", "table_row_wise", "grid_shard"}


def check_constraints(value: Any, where: str) -> dict:
    """A table's ``constraints`` object, checked; FormatError naming ``where`` and the field.
    Unknown keys are refused (a misspelt constraint must not be silently ignored)."""
    if not isinstance(value, Mapping):
        raise FormatError(f"{where}: field 'constraints' must be an object, got {value!r}")
    for key in value:
        if key not in _KEYS:
            raise FormatError(f"{where}: field 'constraints.{key}' is not a constraint (known: {', '.join(_KEYS)})")
    kinds = value.get("sharding_types")
    if kinds is not None and not (isinstance(kinds, list) and kinds and all(k in SHARDING_TYPES for k in kinds)
                                  and len(set(kinds)) == len(kinds)):
        raise FormatError(f"{where}: field 'constraints.sharding_types' must be a non-empty list of distinct names "
                          f"from {', '.join(SHARDING_TYPES)}, got {kinds!r}")
    devices = value.get("devices")
    if devices is not None and not (isinstance(devices, list) and devices
                                    and all(is_int(d) and d >= 0 for d in devices)
                                    and len(set(devices)) == len(devices)):
        raise FormatError(f"{where}: field 'constraints.devices' must be a non-empty list of distinct device "
                          f"numbers >= 0, got {devices!r}")
    for key in ("min_shards", "max_shards"):
        if key in value and not (is_int(value[key]) and value[key] >= 1):
            raise FormatError(f"{where}: field 'constraints.{key}' must be an integer >= 1, got {value[key]!r}")
    if value.get("min_shards", 1) > value.get("max_shards", value.get("min_shards", 1)):
        raise FormatError(f"{where}: field 'constraints': min_shards {value['min_shards']} is more than "
                          f"max_shards {value['max_shards']}")
    if kinds == [DATA_PARALLEL] and value.get("min_shards", 1) > 1:
        raise FormatError(f"{where}: field 'constraints': a table allowed only data_parallel has no shards, "
                          f"but min_shards is {value['min_shards']}")
    return dict(value)


@dataclass(frozen=True)
class TableConstraints:
    """One table's constraints, parsed (``of``); the defaults allow everything."""

    name: str = ""
    sharding_types: frozenset[str] | None = None
    devices: tuple[int, ...] | None = None
    min_shards: int = 1
    max_shards: int | None = None

    @classmethod
    def of(cls, table: "Table") -> "TableConstraints":
        c = getattr(table, "constraints", None) or {}
        kinds = c.get("sharding_types")
        return cls(table.name, None if kinds is None else frozenset(kinds),
                   None if c.get("devices") is None else tuple(sorted(c["devices"])),
                   int(c.get("min_shards", 1)), c.get("max_shards"))

    @property
    def any(self) -> bool:
        return self != TableConstraints(self.name)

    def allows(self, kind: str) -> bool:
        return self.sharding_types is None or kind in self.sharding_types

    def layout_problem(self, blocks_per_strip: Sequence[int], num_devices: int, local: int,
                       final: bool = True) -> str | None:
        """Why a layout of the table (row blocks of each column strip) breaks these
        constraints, or None; ``final=False`` for search states, which may still split."""
        kind = layout_kind(blocks_per_strip, num_devices, local)
        shards = sum(blocks_per_strip)
        if not self.allows(kind):
            return f"its layout is {kind}, not one of its sharding_types {sorted(self.sharding_types)}"
        if self.max_shards is not None and shards > self.max_shards:
            return f"{shards} shards, more than its max_shards {self.max_shards}"
        if final and shards < self.min_shards:
            return f"{shards} shards, fewer than its min_shards {self.min_shards}"
        return None


def table_constraints(tables: Sequence["Table"]) -> list[TableConstraints] | None:
    """Every table's constraints, by table index; None when no table has any (the fast path)."""
    rules = [TableConstraints.of(t) for t in tables]
    return rules if any(r.any for r in rules) else None


def _blocks(pieces: Sequence["Piece"]) -> dict[int, list[int]]:
    """Per table index, the row blocks of each of its column strips."""
    strips: dict[tuple[int, int], int] = {}
    for p in pieces:
        strips[(p.table, p.col_offset)] = strips.get((p.table, p.col_offset), 0) + 1
    out: dict[int, list[int]] = {}
    for (table, _), blocks in sorted(strips.items()):
        out.setdefault(table, []).append(blocks)
    return out


def allowed_state(pieces: Sequence["Piece"], rules: Sequence[TableConstraints] | None, num_devices: int,
                  local: int, final: bool = False) -> bool:
    """Whether every constrained table's pieces take an allowed layout."""
    if rules is None:
        return True
    return all(rules[t].layout_problem(blocks, num_devices, local, final) is None
               for t, blocks in _blocks(pieces).items() if rules[t].any)


def device_mask(pieces: Sequence["Piece"], rules: Sequence[TableConstraints] | None,
                num_devices: int) -> np.ndarray | None:
    """(pieces, devices): True where a piece may go; None when no table is pinned."""
    if rules is None or all(r.devices is None for r in rules):
        return None
    mask = np.ones((len(pieces), num_devices), dtype=bool)
    for i, p in enumerate(pieces):
        pinned = rules[p.table].devices
        if pinned is not None:
            mask[i] = False
            mask[i, [d for d in pinned if d < num_devices]] = True
    return mask


def conform(pieces: list["Piece"], table: "Table", rule: TableConstraints, memory_bytes: float,
            row_bytes_of, num_devices: int, local: int, row_splits: bool = True) -> list["Piece"]:
    """One table's pieces in an allowed layout where every shard fits ``memory_bytes``:
    ``pieces`` (its memory split) when allowed, else the first allowed of table-, column-,
    row-, table-row-wise and grid layouts; InfeasibleError naming the table when none fits.
    ``row_bytes_of(cols)``: memory of one row of a shard that wide."""
    fits = (lambda ps: all(p.num_rows * row_bytes_of(p.num_cols) <= memory_bytes for p in ps))
    ok = (lambda ps: fits(ps) and rule.layout_problem(list(_blocks(ps).values())[0], num_devices, local) is None)
    if ok(pieces):
        return pieces
    whole = Piece(pieces[0].table, 0, table.num_embeddings, 0, table.embedding_dim)
    narrow = narrowest_cols(table.embedding_dim)

    def strips(count: int) -> list[Piece]:  # ``count`` column strips, widest halved first
        out = [whole]
        while len(out) < count:
            widest = max(out, key=lambda p: (p.num_cols, -p.col_offset))
            if widest.num_cols == narrow:
                break
            out.remove(widest)
            out += widest.halve_cols()
        return sorted(out)

    most_strips = table.embedding_dim // narrow
    options: list[list[Piece]] = [[whole]]
    options += [strips(n) for n in range(2, most_strips + 1)]
    if row_splits:
        options += [split_rows(whole, parts) for parts in block_counts(num_devices, local) if parts > 1]
        options += [[b for s in strips(n) for b in split_rows(s, local)] for n in range(2, most_strips + 1)
                    if local > 1]
    for option in options:
        if ok(option):
            return option
    kinds = "" if rule.sharding_types is None else f" {'/'.join(sorted(rule.sharding_types))}"
    counts = [f"at least {rule.min_shards}" if rule.min_shards > 1 else "",
              f"at most {rule.max_shards}" if rule.max_shards is not None else ""]
    shards = f" of {' and '.join(c for c in counts if c)} shards" if any(counts) else ""
    raise InfeasibleError(f"table '{table.name}': no{kinds} layout{shards} allowed by its constraints fits a device "
                          f"of {format_bytes(memory_bytes)} ({table.num_embeddings} rows x {table.embedding_dim} "
                          f"columns{'' if row_splits else ', row-wise splits off'}); relax its constraints")


def check_capacity(tables: "TableSet", num_devices: int, memory_bytes: int, bytes_per_element: int,
                   row_splits: bool = True, optimizer: str = DEFAULT_OPTIMIZER) -> None:
    """Raise InfeasibleError, saying by how much, when no plan can exist (weights and
    ``optimizer``'s state)."""
    total = tables_bytes(tables, bytes_per_element, optimizer)
    capacity = float(np.sum(memory_bytes)) if np.ndim(memory_bytes) else num_devices * memory_bytes
    memory_bytes = float(np.max(memory_bytes))  # per-device memory: a shard must fit the largest device
    if total > capacity:
        raise InfeasibleError(
            f"tables '{tables.name}' need {format_bytes(total)}{_with_state(optimizer)} but {num_devices} devices x "
            f"{format_bytes(memory_bytes)} hold {format_bytes(capacity)}: {format_bytes(total - capacity)} too much "
            f"(need at least {math.ceil(total / memory_bytes)} devices of this memory, or state host memory "
            f"--host-memory or SSD --ssd to keep rows there behind device caches)")
    for table in tables:
        narrowest = narrowest_cols(table.embedding_dim)
        need = (1 if row_splits else table.num_embeddings) * row_bytes(narrowest, bytes_per_element, optimizer)
        if need > memory_bytes:
            raise InfeasibleError(
                f"table '{table.name}' fits on no device even fully split: its smallest shard "
                f"({'1' if row_splits else table.num_embeddings} rows x {narrowest} columns) needs "
                f"{format_bytes(need)}{_with_state(optimizer)}, {format_bytes(need - memory_bytes)} over the {format_bytes(memory_bytes)} "
                f"of a device" + ("" if row_splits else " (row-wise splits are off)"))


def _with_state(optimizer: str) -> str:
    return "" if optimizer == DEFAULT_OPTIMIZER else f" (weights and {optimizer} state)"


def check_feasible(tables: Sequence["Table"], num_devices: int, memory_bytes: Any, row_bytes_of,
                   local: int, row_splits: bool = True) -> None:
    """Refuse, before any search, constraints no plan can meet (one line naming the table):
    unknown pinned devices, pinned devices without the memory for their tables, layouts
    that cannot fit (``conform``)."""
    memory = np.broadcast_to(np.asarray(memory_bytes, dtype=np.float64), (num_devices,))
    rules = table_constraints(tables)
    if rules is None:
        return
    by_devices: dict[tuple[int, ...], list[int]] = {}
    for i, (table, rule) in enumerate(zip(tables, rules)):
        if not rule.any:
            continue
        if rule.devices is not None:
            unknown = [d for d in rule.devices if d >= num_devices]
            if unknown:
                raise InfeasibleError(f"table '{table.name}': constraints.devices names device {unknown[0]}, but "
                                      f"there are {num_devices} devices (0..{num_devices - 1})")
            by_devices.setdefault(rule.devices, []).append(i)
        if rule.sharding_types == frozenset({DATA_PARALLEL}):
            continue  # replicated: the data-parallel search checks it
        pinned = list(rule.devices) if rule.devices is not None else list(range(num_devices))
        conform([Piece(i, 0, table.num_embeddings, 0, table.embedding_dim)], table, rule,
                float(memory[pinned].max()), row_bytes_of, num_devices, local, row_splits)
    for pinned in by_devices:  # every set of pinned devices holds the tables pinned inside it
        inside = [i for devices, members in by_devices.items() if set(devices) <= set(pinned) for i in members]
        need = sum(tables[i].num_embeddings * row_bytes_of(tables[i].embedding_dim) for i in inside)
        have = float(memory[list(pinned)].sum())
        if need > have:
            names = ", ".join(f"'{tables[i].name}'" for i in inside[:3]) + (" ..." if len(inside) > 3 else "")
            raise InfeasibleError(f"table {names}: pinned to devices {list(pinned)}, which hold {format_bytes(have)}, "
                                  f"but need {format_bytes(need)}; pin them to more devices")


def plan_problems(plan: "Plan") -> list[str]:
    """Every way ``plan`` breaks its tables' constraints, one sentence each."""
    out: list[str] = []
    local = plan.local_world_size
    replicated = set(getattr(plan, "data_parallel_tables", ()) or ())
    for table in plan.tables:
        rule = TableConstraints.of(table)
        if not rule.any:
            continue
        if rule.devices is not None and max(rule.devices) >= plan.num_devices:
            out.append(f"table '{table.name}': constraints.devices names device {max(rule.devices)}, but the plan "
                       f"has {plan.num_devices} devices")
            continue
        if table.name in replicated:
            if not rule.allows(DATA_PARALLEL):
                out.append(f"table '{table.name}' is data_parallel, not one of its sharding_types "
                           f"{sorted(rule.sharding_types)}")
            elif rule.devices is not None and len(rule.devices) < plan.num_devices:
                out.append(f"table '{table.name}' is replicated on every device but pinned to {list(rule.devices)}")
            continue
        shards = plan.shards_of(table.name)
        if not shards:
            continue  # the tiling check reports it
        strips: dict[int, int] = {}
        for s in shards:
            strips[s.col_offset] = strips.get(s.col_offset, 0) + 1
        problem = rule.layout_problem([strips[c] for c in sorted(strips)], plan.num_devices, local)
        if problem:
            out.append(f"table '{table.name}' breaks its constraints: {problem}")
        if rule.devices is not None:
            off = sorted({s.device for s in shards} - set(rule.devices))
            if off:
                out.append(f"table '{table.name}' has shards on device {off[0]}, outside its pinned devices "
                           f"{list(rule.devices)}")
    return out
