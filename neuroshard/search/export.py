"""Export a plan in the form TorchRec applies: one ``ParameterSharding`` record per table.

The JSON written by ``neuroshard export --format torchrec``::

    {"format": "neuroshard.torchrec-sharding/v1", "world_size": 4, "compute_device": "cuda",
     "tables": {"t0": {"sharding_type": "column_wise", "compute_kernel": "fused", "ranks": [2, 0],
                       "sharding_spec": [{"shard_offsets": [0, 0],  "shard_sizes": [40000000, 64],
                                          "placement": "rank:2/cuda:2"}, ...]}, ...}}

``sharding_type`` follows TorchRec's names: ``table_wise`` (one shard),
``column_wise`` (column ranges, all rows), ``row_wise`` (row ranges, one per rank on
every rank in rank order, TorchRec's RW), ``table_row_wise`` (row ranges on a subset of
ranks), ``grid_shard`` (split along both). ``to_parameter_shardings`` builds the real
TorchRec objects (``ParameterSharding`` with an ``EnumerableShardingSpec`` of
``ShardMetadata``) and checks that the shards tile each table.
"""
from __future__ import annotations

from typing import Any

from ..errors import NeuroShardError
from ..plan import Plan, Shard

TORCHREC_FORMAT = "neuroshard.torchrec-sharding/v1"
COMPUTE_DEVICES = ("cuda", "cpu")


def _placement(rank: int, compute_device: str, local_world_size: int) -> str:
    return f"rank:{rank}/cpu" if compute_device == "cpu" else f"rank:{rank}/cuda:{rank % local_world_size}"


def _torchrec_type(plan: Plan, shards: list[Shard]) -> str:
    kind = plan.sharding_type(shards[0].table)
    if kind == "mixed":
        return "grid_shard"
    if kind == "row_wise":
        in_rank_order = [s.device for s in sorted(shards, key=lambda s: s.row_offset)] == list(range(plan.num_devices))
        return "row_wise" if in_rank_order else "table_row_wise"
    return kind


def torchrec_sharding(plan: Plan, compute_device: str = "cuda", compute_kernel: str = "fused",
                      local_world_size: int | None = None) -> dict:
    """The plan as per-table ParameterSharding records (plain JSON)."""
    if compute_device not in COMPUTE_DEVICES:
        raise NeuroShardError(f"compute device must be one of {COMPUTE_DEVICES}, got {compute_device!r}")
    plan.validate()
    local = local_world_size or plan.num_devices
    records = {}
    for table in plan.tables:
        shards = sorted(plan.shards_of(table.name), key=lambda s: (s.col_offset, s.row_offset))
        records[table.name] = {
            "sharding_type": _torchrec_type(plan, shards),
            "compute_kernel": compute_kernel,
            "ranks": [s.device for s in shards],
            "sharding_spec": [{"shard_offsets": [s.row_offset, s.col_offset], "shard_sizes": [s.num_rows, s.num_cols],
                               "placement": _placement(s.device, compute_device, local)} for s in shards],
        }
    return {"format": TORCHREC_FORMAT, "tables_name": plan.tables_name, "world_size": plan.num_devices,
            "compute_device": compute_device, "tables": records}


def to_parameter_shardings(exported: dict, table_sizes: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """Real TorchRec ``ParameterSharding`` objects from ``torchrec_sharding``'s output
    (TorchRec must be importable). With ``table_sizes`` (name -> (rows, dim)), also check
    that each table's shards cover it exactly."""
    from .torchrec_planner import require_torchrec
    require_torchrec()
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torch.distributed._shard.sharding_spec._internals import check_tensor
    from torchrec.distributed.types import ParameterSharding, ShardingType

    if exported.get("format") != TORCHREC_FORMAT:
        raise NeuroShardError(f"not a {TORCHREC_FORMAT} document (format {exported.get('format')!r})")
    known = {t.value for t in ShardingType}
    out = {}
    for name, record in exported["tables"].items():
        if record["sharding_type"] not in known:
            raise NeuroShardError(f"table '{name}': TorchRec has no sharding type {record['sharding_type']!r}")
        metadata = [ShardMetadata(shard_offsets=list(s["shard_offsets"]), shard_sizes=list(s["shard_sizes"]),
                                  placement=s["placement"]) for s in record["sharding_spec"]]
        spec = EnumerableShardingSpec(metadata)  # refuses overlapping shards
        if table_sizes is not None:
            try:
                check_tensor(metadata, list(table_sizes[name]))  # refuses gaps and out-of-bounds shards
            except ValueError as exc:
                raise NeuroShardError(f"table '{name}': {exc}") from None
        out[name] = ParameterSharding(sharding_type=record["sharding_type"], compute_kernel=record["compute_kernel"],
                                      ranks=list(record["ranks"]), sharding_spec=spec)
    return out
