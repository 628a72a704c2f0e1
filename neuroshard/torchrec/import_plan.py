"""TorchRec sharding plans -> our shards and ``neuroshard.plan/v1`` plans: the one
converter shared by ``-a torchrec`` (TorchRec's planner as a baseline) and
``neuroshard plan import --format torchrec``.

Accepted, as Python objects or JSON:

* TorchRec's own objects: a ``ShardingPlan``, an ``EmbeddingModuleShardingPlan``, or a
  dict of table name -> ``ParameterSharding``;
* the JSON our exporter writes (``neuroshard.torchrec-sharding/v1``);
* the JSON form of TorchRec's plan: ``{module path: {table: record}}`` (optionally
  under ``"plan"``) or ``{table: record}``, where a record is a ``ParameterSharding``
  as plain JSON: ``{"sharding_type", "compute_kernel", "ranks", "sharding_spec": [
  {"shard_offsets": [row, col], "shard_sizes": [rows, cols], "placement":
  "rank:R/cuda:L"}, ...]}`` (``placement`` may be left out when ``ranks`` names the
  rank of every shard).

A shard's device is its placement's rank; empty shards (TorchRec gives ranks past
the last row block 0 rows) are left out. Tables replicated on every rank
(``data_parallel``, no shards) become the plan's ``data_parallel_tables``.

A table's compute kernel gives its memory tier (``tier_of_record``, the inverse of the
export's ``tier_kernel``): ``fused_uvm_caching`` is host memory behind a device cache of
``cache_params.load_factor`` of the rows (TorchRec's default 0.2 without one), ``fused_uvm``
host memory without a cache, ``key_value`` the SSD (cached when ``cache_params`` gives a
``load_factor``); every other kernel is device memory.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Mapping

from ..constants import DATA_PARALLEL, FP32_BYTES
from ..errors import FormatError, InvalidPlanError
from ..optimizers import DEFAULT_OPTIMIZER, FBGEMM_OPTIMIZERS
from ..plan import PLAN_FORMAT, Plan, Shard
from ..tables import Table, TableSet
from ..tiers import IN_DEVICE_MEMORY, Tier
from ..topology import make_topology
from ..validate import COMM_PRECISIONS, is_int, read_json
from .export import CACHING_KERNEL, DEFAULT_CACHE_LOAD_FACTOR, KEY_VALUE_KERNEL, TORCHREC_FORMAT, UVM_KERNEL

_RANK = re.compile(r"^rank:(\d+)(/.*)?$")


def record_of(sharding: Any) -> dict:
    """A ``ParameterSharding`` (or its JSON record) as a plain JSON record."""
    if isinstance(sharding, Mapping):
        return dict(sharding)
    spec = getattr(sharding, "sharding_spec", None)
    shards = None if spec is None else [
        {"shard_offsets": [int(x) for x in m.shard_offsets], "shard_sizes": [int(x) for x in m.shard_sizes],
         "placement": str(m.placement)} for m in getattr(spec, "shards", [])]
    kind = getattr(sharding, "sharding_type", None)
    kernel = getattr(sharding, "compute_kernel", None)
    record = {"sharding_type": getattr(kind, "value", kind), "compute_kernel": getattr(kernel, "value", kernel),
              "ranks": list(getattr(sharding, "ranks", None) or []), "sharding_spec": shards}
    cache = getattr(sharding, "cache_params", None)
    if cache is not None:  # TorchRec's CacheParams: what the memory tier needs of it
        params = {"load_factor": cache.load_factor,
                  "algorithm": getattr(cache.algorithm, "name", cache.algorithm)}
        record["cache_params"] = {k: v for k, v in params.items() if v is not None}
    return record


def sharding_plan_json(plan: Any) -> dict:
    """TorchRec's ``ShardingPlan`` (or one module's plan) as the plain JSON ``plan import``
    reads: ``{module path: {table: record}}`` (``{table: record}`` for one module)."""
    plan = getattr(plan, "plan", plan)
    if all(hasattr(v, "sharding_spec") for v in dict(plan).values()):
        return {name: record_of(sharding) for name, sharding in dict(plan).items()}
    return {path: {name: record_of(sharding) for name, sharding in dict(module_plan).items()}
            for path, module_plan in dict(plan).items()}


def table_records(source: Any, where: str = "<torchrec plan>") -> tuple[dict[str, dict], int | None]:
    """Per-table JSON records of any accepted form, and the world size when it says one."""
    world = None
    if hasattr(source, "plan") and not isinstance(source, Mapping):  # ShardingPlan
        source = source.plan
    if not isinstance(source, Mapping):
        raise FormatError(f"{where}: a TorchRec plan must be an object of per-table ParameterSharding records")
    if source.get("format") == TORCHREC_FORMAT:
        world = source.get("world_size")
        if not (is_int(world) and world >= 1):
            raise FormatError(f"{where}: field 'world_size' must be an integer >= 1, got {world!r}")
        source = source.get("tables")
        if not isinstance(source, Mapping):
            raise FormatError(f"{where}: field 'tables' must be an object")
    elif isinstance(source.get("format"), str):
        raise FormatError(f"{where}: format {source['format']!r} is not a TorchRec plan "
                          f"(expected {TORCHREC_FORMAT!r} or ParameterSharding records)")
    elif isinstance(source.get("plan"), Mapping):
        source = source["plan"]

    def is_record(value: Any) -> bool:
        return isinstance(value, Mapping) and "sharding_type" in value or hasattr(value, "sharding_spec")

    if source and all(is_record(v) for v in source.values()):
        tables = dict(source)
    elif source and all(isinstance(v, Mapping) or hasattr(v, "keys") for v in source.values()):
        tables = {}
        for module, module_plan in source.items():  # {module path: {table: record}}
            for name, record in dict(module_plan).items():
                if not is_record(record):
                    raise FormatError(f"{where}: module '{module}', table '{name}': not a ParameterSharding record "
                                      f"(it needs 'sharding_type' and 'sharding_spec')")
                if name in tables:
                    raise FormatError(f"{where}: table '{name}' appears in two modules")
                tables[name] = record
    else:
        raise FormatError(f"{where}: no ParameterSharding records found (expected {{table: record}} or "
                          f"{{module: {{table: record}}}})")
    return {str(name): record_of(rec) for name, rec in tables.items()}, world


def shards_of_record(name: str, record: Mapping, where: str = "<torchrec plan>") -> list[Shard]:
    """One table's shards from its JSON record (FormatError naming the table when malformed)."""
    here = f"{where}: table '{name}'"
    spec = record.get("sharding_spec")
    if record.get("sharding_type") == DATA_PARALLEL:  # replicated on every rank: no shards
        if spec:
            raise FormatError(f"{here} is data_parallel (replicated on every rank) but lists shards")
        return []
    if spec is None:
        raise FormatError(f"{here} is {record.get('sharding_type')!r} with no shards")
    if not isinstance(spec, list) or not spec:
        raise FormatError(f"{here}: 'sharding_spec' must be a non-empty list of shards")
    ranks = record.get("ranks") or []
    out = []
    for i, meta in enumerate(spec):
        if not isinstance(meta, Mapping):
            raise FormatError(f"{here}, shard #{i}: must be an object")
        offsets, sizes = meta.get("shard_offsets"), meta.get("shard_sizes")
        for key, value in (("shard_offsets", offsets), ("shard_sizes", sizes)):
            if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(is_int(x) and x >= 0 for x in value)):
                raise FormatError(f"{here}, shard #{i}: '{key}' must be [rows, cols] of integers >= 0, "
                                  f"got {value!r}")
        if sizes[0] == 0 or sizes[1] == 0:  # TorchRec's empty last row blocks (5 rows on 4 ranks: 2, 2, 1, 0)
            continue
        placement = meta.get("placement")
        if placement is not None:
            match = _RANK.match(str(placement))
            if not match:
                raise FormatError(f"{here}, shard #{i}: placement {placement!r} is not 'rank:R/device'")
            rank = int(match.group(1))
        elif i < len(ranks) and is_int(ranks[i]) and ranks[i] >= 0:
            rank = ranks[i]
        else:
            raise FormatError(f"{here}, shard #{i}: no placement and no rank")
        out.append(Shard(name, offsets[0], sizes[0], offsets[1], sizes[1], rank))
    return out


def tier_of_record(name: str, record: Mapping, where: str = "<torchrec plan>") -> Tier:
    """A table's memory tier from its record's compute kernel and ``cache_params`` (FormatError
    naming the table for a ``load_factor`` outside (0, 1])."""
    kernel = record.get("compute_kernel")
    if kernel not in (CACHING_KERNEL, UVM_KERNEL, KEY_VALUE_KERNEL):
        return IN_DEVICE_MEMORY
    params = record.get("cache_params")
    if params is not None and not isinstance(params, Mapping):
        raise FormatError(f"{where}: table '{name}': 'cache_params' must be an object, got {params!r}"[:300])
    fraction = None if params is None else params.get("load_factor")
    if kernel == CACHING_KERNEL and fraction is None:
        fraction = DEFAULT_CACHE_LOAD_FACTOR  # what TorchRec gives a cache it is told nothing about
    if kernel == UVM_KERNEL:
        fraction = None  # no cache: a load factor would be unused
    try:
        return Tier("ssd" if kernel == KEY_VALUE_KERNEL else "host", fraction)
    except FormatError as exc:
        raise FormatError(f"{where}: table '{name}': cache_params.load_factor: {exc}"[:300]) from None


def shards_from_torchrec(source: Any, where: str = "<torchrec plan>") -> tuple[list[Shard], int | None]:
    """Our shards of every table in a TorchRec plan (any accepted form), and its world
    size when it records one."""
    records, world = table_records(source, where)
    return [s for name, record in records.items() for s in shards_of_record(name, record, where)], world


def _comm_precision(source: Any, where: str) -> str:
    """The plan's ``comm_precision`` from an export's ``qcomms`` (fp32 without one)."""
    qcomms = source.get("qcomms") if isinstance(source, dict) else None
    if qcomms is None:
        return "fp32"
    precision = qcomms.get("forward_precision") if isinstance(qcomms, dict) else None
    if precision not in COMM_PRECISIONS or qcomms.get("backward_precision") != precision:
        raise FormatError(f"{where}: field 'qcomms' must give one of {', '.join(COMM_PRECISIONS)} as both "
                          f"forward_precision and backward_precision, got {qcomms!r}")
    return precision


def _optimizer(source: Any, where: str) -> str:
    """The plan's ``optimizer`` from an export's ``fused_params`` (sgd without one)."""
    params = source.get("fused_params") if isinstance(source, dict) else None
    if params is None:
        return DEFAULT_OPTIMIZER
    ours = {v: k for k, v in FBGEMM_OPTIMIZERS.items()}
    name = params.get("optimizer") if isinstance(params, dict) else None
    if name not in ours:
        raise FormatError(f"{where}: field 'fused_params.optimizer' must be one of {', '.join(ours)}, got {name!r}")
    return ours[name]


def plan_from_torchrec(source: Any, tables: TableSet | list[Table], num_devices: int | None = None,
                       memory_bytes: int | None = None, bytes_per_element: int = FP32_BYTES,
                       where: str = "<torchrec plan>", provenance: dict | None = None,
                       host_memory_bytes: int | None = None, ssd_bytes: int | None = None) -> Plan:
    """A validated ``Plan`` of ``tables`` from a TorchRec plan. ``num_devices`` defaults to
    the plan's world size (or its highest rank + 1), ``memory_bytes`` to the fullest
    device's shards (so the plan fits). Every table must be in both. Tables whose kernel
    keeps them in host memory or on SSD get that tier (``tier_of_record``), and the plan
    a topology with ``host_memory_bytes`` (``ssd_bytes``) per host, by default the fullest
    host's use of that tier."""
    if not isinstance(tables, TableSet):
        tables = TableSet("tables", list(tables))
    records, world = table_records(source, where)
    shards = [dataclasses.replace(s, tier=tier_of_record(name, record, where))
              for name, record in records.items() for s in shards_of_record(name, record, where)]
    replicated = {name for name, record in records.items() if record.get("sharding_type") == DATA_PARALLEL}
    mine = {s.table for s in shards} | replicated
    theirs = {t.name for t in tables}
    if mine != theirs:
        raise InvalidPlanError(f"{where} does not match tables '{tables.name}': tables without shards "
                               f"{sorted(theirs - mine)[:3]}, shards of unknown tables {sorted(mine - theirs)[:3]}")
    ranks = {name: list(records[name].get("ranks") or []) for name in sorted(replicated)}
    top = max([s.device for s in shards] + [r for rs in ranks.values() for r in rs if is_int(r)], default=0) + 1
    devices = num_devices or world or top
    if top > devices:
        raise InvalidPlanError(f"{where}: a shard is on rank {top - 1}, outside {devices} devices")
    for name, rs in ranks.items():  # replicated on every rank, as the runtime runs it
        if rs and rs != list(range(devices)):
            raise FormatError(f"{where}: table '{name}' is data_parallel on ranks {rs[:8]}, not on all {devices} "
                              f"ranks 0..{devices - 1}")
    plan = Plan(list(tables), shards, devices, 1, bytes_per_element, tables.name,
                provenance={"algorithm": "torchrec-import", **(provenance or {})}, data_parallel_tables=[t.name for t in tables if t.name in replicated],
                comm_precision=_comm_precision(source, where), optimizer=_optimizer(source, where))
    plan.device_memory_bytes = memory_bytes or max(max(plan.memory_used_bytes()), 1)  # replicas included
    if plan.tiered:  # each tier's capacity per host (hosts of TorchRec's default size, as the plan counts them)
        host = host_memory_bytes or max(max(plan.backing_used_bytes("host")), 1)
        ssd = ssd_bytes or max(max(plan.backing_used_bytes("ssd")), 1)
        used = {s.tier.memory for s in shards}
        plan.topology = make_topology(devices, source=where, error=FormatError,
                                      host_memory_bytes=host if "host" in used or host_memory_bytes else None,
                                      ssd_bytes=ssd if "ssd" in used or ssd_bytes else None)
    return plan.validate()


def read_any_plan(path: str | Path, tables: TableSet | None = None, memory_bytes: int | None = None) -> Plan:
    """A ``neuroshard.plan/v1`` file, or a TorchRec plan (our export, or ParameterSharding
    records as JSON) converted for ``tables``."""
    data = read_json(path, "plan file")
    if isinstance(data, dict) and data.get("format") == PLAN_FORMAT:
        return Plan.from_dict(data, source=str(path))
    if tables is None:
        raise FormatError(f"{path}: not a {PLAN_FORMAT} file; a TorchRec plan needs --tables "
                          f"(or convert it first with `neuroshard plan import`)")
    return plan_from_torchrec(data, tables, memory_bytes=memory_bytes, where=str(path),
                              provenance={"source": str(path)})
