"""Export a plan in the form TorchRec applies: one ``ParameterSharding`` record per table.

The JSON written by ``neuroshard export --format torchrec``::

    {"format": "neuroshard.torchrec-sharding/v1", "world_size": 4, "local_world_size": 4,
     "compute_device": "cuda", "tables_name": "...",
     "tables": {"t0": {"sharding_type": "column_wise", "compute_kernel": "fused", "ranks": [2, 0],
                       "sharding_spec": [{"shard_offsets": [0, 0],  "shard_sizes": [40000000, 64],
                                          "placement": "rank:2/cuda:2"}, ...]}, ...}}

Every record is one TorchRec runs *exactly* (checked on 2 gloo processes with the
fused kernel in ``tests/test_torchrec_interop.py``); a table laid out any other way
is refused with a one-line ``NeuroShardError`` naming it, never exported wrong:

* ``table_wise``: one shard.
* ``column_wise``: column ranges of all rows, any widths, any ranks (two on one rank too).
* ``row_wise``: ``W`` row shards (``W`` = world size) on ranks ``0..W-1`` in row order,
  in TorchRec's blocks: ``ceil(rows / W)`` rows each, the last smaller. TorchRec
  routes id ``i`` to rank ``i // ceil(rows / W)`` whatever the shard sizes say, so any
  other split returns wrong embeddings without an error.
* ``table_row_wise``: the same over the ``L`` ranks of one host (``L`` = local world
  size, ranks ``h*L .. h*L+L-1``), blocks of ``ceil(rows / L)``.
* ``grid_shard``: column strips, each cut into ``L`` such row blocks on one host's
  ranks in order (TorchRec routes a grid's ids like table-row-wise).
* ``data_parallel``: a table of the plan's ``data_parallel_tables``, replicated on all
  ranks (``ranks`` 0..W-1, no ``sharding_spec``, TorchRec's ``dense`` compute kernel).

Placements are ``rank:R/cuda:(R mod L)`` (one GPU per local rank) or ``rank:R/cpu``.
A plan whose ``comm_precision`` is not fp32 adds ``"qcomms": {"forward_precision": P,
"backward_precision": P}`` (TorchRec's ``CommType`` values); ``qcomms_config`` turns it
into TorchRec's ``QCommsConfig``, which the sharder takes as a codecs registry.
A plan whose ``optimizer`` is not sgd adds ``"fused_params": {"optimizer": NAME}`` (fbgemm's
``EmbOptimType`` member, e.g. ``EXACT_ROWWISE_ADAGRAD``); ``fused_params`` turns it into
the sharder's ``fused_params`` (add your ``learning_rate``).
``to_parameter_shardings`` builds the real TorchRec objects (``ParameterSharding`` with
an ``EnumerableShardingSpec`` of ``ShardMetadata``) and checks that the shards tile
each table; ``parameter_constraints`` gives TorchRec's planner the same kernels and layouts.

Memory tiers (``neuroshard.tiers``): a table outside device memory runs the kernel of its
tier, whatever ``compute_kernel`` says (that one is for the tables in device memory):

* ``host`` with a ``cache_fraction`` ``f``: ``fused_uvm_caching``, ``"cache_params":
  {"load_factor": f, "algorithm": "LRU" | "LFU"}``;
* ``host`` without a cache: ``fused_uvm`` (every lookup crosses the host link);
* ``ssd``: ``key_value`` (fbgemm's SSD table), with ``"cache_params": {"load_factor": f}``
  when it has a ``cache_fraction`` (its cache has no choice of eviction). Without one,
  TorchRec gives the SSD table its default cache (0.2 of the rows), which the plan does
  not count in device memory: the export says so in a warning.
"""
from __future__ import annotations

import logging
from typing import Any

from ..constants import CACHE_ALGORITHMS, COMPUTE_KERNELS, DATA_PARALLEL, DEFAULT_ROW_BLOCKS
from ..errors import NeuroShardError
from ..exporters import Exporter
from ..optimizers import DEFAULT_OPTIMIZER, FBGEMM_OPTIMIZERS
from ..plan import Plan, Shard
from ..tiers import Tier
from ..types import ceil_blocks
from .guard import require_torchrec

TORCHREC_FORMAT = "neuroshard.torchrec-sharding/v1"
COMPUTE_DEVICES = ("cuda", "cpu")
#: the kernel that keeps a table in host memory behind a device cache (UVM), and TorchRec's
#: default share of the rows its cache holds (``CacheParams.load_factor``, its planner's 0.2)
CACHING_KERNEL = "fused_uvm_caching"
DEFAULT_CACHE_LOAD_FACTOR = 0.2
#: the kernel of a table in host memory without a device cache, and of one on SSD (fbgemm's
#: SSD-backed table, always behind a device cache: ``load_factor`` sizes it)
UVM_KERNEL = "fused_uvm"
KEY_VALUE_KERNEL = "key_value"
#: TorchRec's compute kernel for replicated tables (``EmbeddingComputeKernel.DENSE``)
DATA_PARALLEL_KERNEL = "dense"

log = logging.getLogger("neuroshard.torchrec")


#: the compute device of an export unless told otherwise: TorchRec exports are for training on
#: GPUs, wherever the export is written (``cpu``: for TorchRec's DMP on CPU processes)
DEFAULT_COMPUTE_DEVICE = "cuda"


def _placement(rank: int, compute_device: str, local_world_size: int) -> str:
    return f"rank:{rank}/cpu" if compute_device == "cpu" else f"rank:{rank}/cuda:{rank % local_world_size}"


def _row_blocks_problem(name: str, rows: int, blocks: list[Shard], parts: int, what: str) -> str | None:
    """Why ``blocks`` (row order) are not TorchRec's ``parts`` ceil blocks of ``rows``, or None."""
    expected = ceil_blocks(rows, parts)
    got = [(s.row_offset, s.num_rows) for s in blocks]
    if got == expected:
        return None
    sizes = ", ".join(str(n) for _, n in got[:4]) + (", ..." if len(got) > 4 else "")
    want = ", ".join(str(n) for _, n in expected[:4]) + (", ..." if len(expected) > 4 else "")
    return (f"table '{name}': {what} row shards of {sizes} rows are not TorchRec's blocks of ceil({rows}/{parts}) "
            f"rows ({want}); TorchRec would route ids to the wrong shards")


def _check_ranks(name: str, blocks: list[Shard], world: int, local: int) -> str:
    """``row_wise`` or ``table_row_wise`` for row blocks on ranks TorchRec accepts, else raise."""
    devices = [s.device for s in blocks]
    if devices == list(range(world)):
        return "row_wise"
    if len(devices) == local and devices[0] % local == 0 and devices == list(range(devices[0], devices[0] + local)):
        return "table_row_wise"
    raise NeuroShardError(
        f"table '{name}': row shards on devices {devices[:8]}{' ...' if len(devices) > 8 else ''} cannot run in "
        f"TorchRec, which puts row block i on rank i of all {world} ranks (row_wise) or of one host's "
        f"{local} ranks (table_row_wise; see --local-world-size)")


def torchrec_layout(plan: Plan, table: str, local_world_size: int) -> tuple[str, list[Shard]]:
    """TorchRec's sharding type for one table and its shards in TorchRec's order; a
    one-line NeuroShardError naming the table when TorchRec cannot run it exactly."""
    world, local = plan.num_devices, local_world_size
    t = plan.table(table)
    shards = sorted(plan.shards_of(table), key=lambda s: (s.col_offset, s.row_offset))
    if len(shards) == 1:
        return "table_wise", shards
    if all(s.num_rows == t.num_embeddings for s in shards):
        return "column_wise", shards
    strips: dict[tuple[int, int], list[Shard]] = {}
    for s in shards:
        strips.setdefault((s.col_offset, s.num_cols), []).append(s)
    bounds = sorted(strips)
    if any(a[0] + a[1] > b[0] for a, b in zip(bounds, bounds[1:])):
        raise NeuroShardError(f"table '{table}': its shards do not form column strips cut into row blocks "
                              f"(an irregular grid), which TorchRec cannot run")
    if len(strips) == 1:
        if len(shards) not in (world, local):
            raise NeuroShardError(f"table '{table}' is split into {len(shards)} row shards; TorchRec runs row shards "
                                  f"on all {world} ranks (row_wise) or on one host's {local} ranks (table_row_wise)")
        problem = _row_blocks_problem(table, t.num_embeddings, shards, len(shards), f"its {len(shards)}")
        if problem:
            raise NeuroShardError(problem)
        return _check_ranks(table, shards, world, local), shards
    for (col, cols), blocks in sorted(strips.items()):
        what = f"columns [{col}, {col + cols})"
        if len(blocks) != local:
            raise NeuroShardError(f"table '{table}': {what} are split into {len(blocks)} row shards; a grid in "
                                  f"TorchRec cuts every column strip into one host's {local} ranks")
        problem = _row_blocks_problem(table, t.num_embeddings, blocks, local, f"{what}:")
        if problem:
            raise NeuroShardError(problem)
        devices = [s.device for s in blocks]
        if devices[0] % local or devices != list(range(devices[0], devices[0] + local)):
            raise NeuroShardError(f"table '{table}': {what} have row shards on devices {devices}; a grid in "
                                  f"TorchRec puts row block i on rank i of one host's {local} ranks")
    return "grid_shard", shards


def torchrec_sharding(plan: Plan, compute_device: str | None = None, compute_kernel: str = "fused",
                      local_world_size: int | None = None, cache_load_factor: float | None = None,
                      cache_algorithm: str | None = None) -> dict:
    """The plan as per-table ParameterSharding records (plain JSON), each one TorchRec
    runs exactly; NeuroShardError naming the first table it cannot.
    ``compute_device`` defaults to ``DEFAULT_COMPUTE_DEVICE`` (cuda), ``local_world_size``
    (ranks per host) to the plan's topology's, else ``default_local_world_size``.
    ``compute_kernel`` (and ``cache_load_factor`` with ``fused_uvm_caching``) is the kernel
    of the tables in device memory; a table in another memory tier runs its tier's kernel
    (``tier_kernel``), ``cache_algorithm`` (lru when None) applying to every
    ``fused_uvm_caching`` table."""
    compute_device = compute_device or DEFAULT_COMPUTE_DEVICE
    if compute_device not in COMPUTE_DEVICES:
        raise NeuroShardError(f"compute device must be one of {COMPUTE_DEVICES}, got {compute_device!r}")
    if compute_kernel not in COMPUTE_KERNELS:
        raise NeuroShardError(f"compute kernel must be one of {', '.join(COMPUTE_KERNELS)}, got {compute_kernel!r}")
    tiers = plan.tiers()
    host_cached = any(t.memory == "host" and t.cached for t in tiers.values())
    # the cache algorithm serves the plan's cached host tables too: it needs no caching kernel then
    cache = _cache_params(compute_kernel, cache_load_factor,
                          None if host_cached and compute_kernel != CACHING_KERNEL else cache_algorithm, plan.tiered)
    algorithm = _cache_algorithm(cache_algorithm)
    plan.validate()
    world = plan.num_devices
    local = plan.local_world_size if local_world_size is None else local_world_size
    if not (isinstance(local, int) and 1 <= local and world % local == 0):
        raise NeuroShardError(f"local world size must divide the world size {world}, got {local_world_size!r}")
    records = {}
    for table in plan.tables:
        if table.name in plan.data_parallel_tables:
            records[table.name] = {"sharding_type": DATA_PARALLEL, "compute_kernel": DATA_PARALLEL_KERNEL,
                                   "ranks": list(range(world))}
            continue
        try:
            kind, shards = torchrec_layout(plan, table.name, local)
        except NeuroShardError as exc:
            # the search was told it may cut row blocks TorchRec does not run: say so
            if plan.row_blocks != DEFAULT_ROW_BLOCKS:
                raise NeuroShardError(f"{exc} (the plan was searched with --row-blocks "
                                      f"{plan.row_blocks}: search with --row-blocks torchrec for a "
                                      f"plan TorchRec runs)") from None
            raise
        kernel, params = tier_kernel(tiers[table.name], algorithm)
        if kernel is None:  # device memory: the kernel asked for
            kernel, params = compute_kernel, cache
        elif kernel == KEY_VALUE_KERNEL and params is None:
            log.warning("table '%s' is on SSD without a device cache, but fbgemm's SSD table always has one: "
                        "TorchRec gives it %g of the rows, which the plan does not count in device memory",
                        table.name, DEFAULT_CACHE_LOAD_FACTOR)
        records[table.name] = {
            "sharding_type": kind,
            "compute_kernel": kernel,
            "ranks": [s.device for s in shards],
            "sharding_spec": [{"shard_offsets": [s.row_offset, s.col_offset], "shard_sizes": [s.num_rows, s.num_cols],
                               "placement": _placement(s.device, compute_device, local)} for s in shards],
            **({"cache_params": dict(params)} if params else {}),
        }
    out = {"format": TORCHREC_FORMAT, "tables_name": plan.tables_name, "world_size": world,
           "local_world_size": local, "compute_device": compute_device, "tables": records}
    if plan.comm_precision != "fp32":  # pooled embeddings forward and their gradients backward
        out["qcomms"] = {"forward_precision": plan.comm_precision, "backward_precision": plan.comm_precision}
    if plan.optimizer != DEFAULT_OPTIMIZER:  # the fused TBE optimizer TorchRec's sharder applies in backward
        out["fused_params"] = {"optimizer": FBGEMM_OPTIMIZERS[plan.optimizer]}
    return out


def tier_kernel(tier: Tier, cache_algorithm: str = "LRU") -> tuple[str | None, dict | None]:
    """TorchRec's compute kernel of a table in ``tier`` and its ``cache_params`` record
    (``cache_algorithm``, TorchRec's ``CacheAlgorithm`` name, for ``fused_uvm_caching``);
    ``(None, None)`` in device memory, where the export's ``compute_kernel`` applies."""
    if tier.on_device:
        return None, None
    if tier.memory == "ssd":
        return KEY_VALUE_KERNEL, None if tier.cache_fraction is None else {"load_factor": float(tier.cache_fraction)}
    if tier.cache_fraction is None:
        return UVM_KERNEL, None
    return CACHING_KERNEL, {"load_factor": float(tier.cache_fraction), "algorithm": cache_algorithm}


def _cache_algorithm(algorithm: str | None) -> str:
    """TorchRec's ``CacheAlgorithm`` name of ``algorithm`` (lru when None)."""
    algorithm = algorithm or "lru"
    if algorithm not in CACHE_ALGORITHMS:
        raise NeuroShardError(f"cache algorithm must be one of {', '.join(CACHE_ALGORITHMS)}, got {algorithm!r}")
    return algorithm.upper()


def _cache_params(compute_kernel: str, load_factor: float | None, algorithm: str | None,
                  tiered: bool = False) -> dict | None:
    """A caching kernel's ``cache_params`` record (``load_factor``: the share of each table's
    rows its device cache holds, TorchRec's default when None; ``algorithm``: lru (None) or lfu),
    None for the other kernels; NeuroShardError for a cache setting without a caching kernel."""
    if compute_kernel != CACHING_KERNEL:
        if load_factor is not None or algorithm is not None:
            hint = (" for the tables in device memory (a cached table's load factor is its plan's cache_fraction)"
                    if tiered and load_factor is not None else "")
            raise NeuroShardError(f"cache settings need compute kernel {CACHING_KERNEL}{hint}, got {compute_kernel}")
        return None
    if load_factor is None:
        load_factor = DEFAULT_CACHE_LOAD_FACTOR
    if isinstance(load_factor, bool) or not isinstance(load_factor, (int, float)) or not 0 < load_factor <= 1:
        raise NeuroShardError(f"cache load factor must be a number in (0, 1], got {load_factor!r}")
    return {"load_factor": float(load_factor), "algorithm": _cache_algorithm(algorithm)}


def fused_params(exported: dict) -> dict:
    """TorchRec's sharder ``fused_params`` for an exported document (``{}`` when it has none:
    the sharder's default), e.g. ``EmbeddingBagCollectionSharder(fused_params={**fused_params(doc),
    "learning_rate": 0.01})``."""
    params = exported.get("fused_params")
    if params is None:
        return {}
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    name = params.get("optimizer") if isinstance(params, dict) else None
    if name not in FBGEMM_OPTIMIZERS.values():
        raise NeuroShardError(f"fused_params: field 'optimizer' must be one of "
                              f"{', '.join(FBGEMM_OPTIMIZERS.values())}, got {name!r}")
    return {"optimizer": EmbOptimType[name]}


def qcomms_config(exported: dict) -> Any:
    """TorchRec's ``QCommsConfig`` for an exported document's ``qcomms`` (None when it has
    none: fp32 communication). Use it as
    ``EmbeddingBagCollectionSharder(qcomm_codecs_registry=get_qcomm_codecs_registry(config))``."""
    qcomms = exported.get("qcomms")
    if qcomms is None:
        return None
    require_torchrec()
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig
    known = {t.value for t in CommType}
    for key in ("forward_precision", "backward_precision"):
        if not isinstance(qcomms, dict) or qcomms.get(key) not in known:
            raise NeuroShardError(f"qcomms: field '{key}' must be one of {', '.join(sorted(known))}, "
                                  f"got {qcomms.get(key) if isinstance(qcomms, dict) else qcomms!r}")
    return QCommsConfig(forward_precision=CommType(qcomms["forward_precision"]),
                        backward_precision=CommType(qcomms["backward_precision"]))


def to_parameter_shardings(exported: dict, table_sizes: dict[str, tuple[int, int]] | None = None,
                           key_value_params: Any = None) -> dict[str, Any]:
    """Real TorchRec ``ParameterSharding`` objects from ``torchrec_sharding``'s output
    (TorchRec must be importable), with each record's compute kernel and its
    ``cache_params`` as TorchRec's ``CacheParams``. With ``table_sizes`` (name -> (rows,
    dim)), also check that each table's shards cover it exactly. ``key_value_params``
    (TorchRec's ``KeyValueParams``, e.g. its ``ssd_storage_directory``) goes to every
    ``key_value`` table (None: TorchRec's defaults)."""
    require_torchrec()
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torch.distributed._shard.sharding_spec._internals import check_tensor
    from torchrec.distributed.types import ParameterSharding

    out = {}
    for name, record in _records(exported).items():
        if record["sharding_type"] == DATA_PARALLEL:  # replicated: no sharding spec
            out[name] = ParameterSharding(sharding_type=DATA_PARALLEL, compute_kernel=record["compute_kernel"],
                                          ranks=list(record["ranks"]), sharding_spec=None)
            continue
        metadata = [ShardMetadata(shard_offsets=list(s["shard_offsets"]), shard_sizes=list(s["shard_sizes"]),
                                  placement=s["placement"]) for s in record["sharding_spec"]]
        spec = EnumerableShardingSpec(metadata)  # refuses overlapping shards
        if table_sizes is not None:
            try:
                check_tensor(metadata, list(table_sizes[name]))  # refuses gaps and out-of-bounds shards
            except ValueError as exc:
                raise NeuroShardError(f"table '{name}': {exc}") from None
        out[name] = ParameterSharding(
            sharding_type=record["sharding_type"], compute_kernel=record["compute_kernel"],
            ranks=list(record["ranks"]), sharding_spec=spec, cache_params=_torchrec_cache_params(name, record),
            key_value_params=key_value_params if record["compute_kernel"] == KEY_VALUE_KERNEL else None)
    return out


def parameter_constraints(exported: dict, key_value_params: Any = None) -> dict[str, Any]:
    """TorchRec ``ParameterConstraints`` per table of ``torchrec_sharding``'s output: its
    sharding type and compute kernel as the only ones allowed, its ``CacheParams`` (and
    ``key_value_params`` for ``key_value`` tables), so that TorchRec's own planner places
    the tables with the kernels of their memory tiers:
    ``EmbeddingShardingPlanner(topology, constraints=parameter_constraints(doc))``. Add your
    pooling factors to the constraints; the placement itself is TorchRec's."""
    require_torchrec()
    from torchrec.distributed.planner.types import ParameterConstraints

    return {name: ParameterConstraints(
        sharding_types=[record["sharding_type"]], compute_kernels=[record["compute_kernel"]],
        cache_params=_torchrec_cache_params(name, record),
        key_value_params=key_value_params if record["compute_kernel"] == KEY_VALUE_KERNEL else None)
        for name, record in _records(exported).items()}


def _records(exported: dict) -> dict[str, dict]:
    """The per-table records of an exported document, each with a sharding type TorchRec knows."""
    from torchrec.distributed.types import ShardingType

    if exported.get("format") != TORCHREC_FORMAT:
        raise NeuroShardError(f"not a {TORCHREC_FORMAT} document (format {exported.get('format')!r})")
    known = {t.value for t in ShardingType}
    for name, record in exported["tables"].items():
        if record["sharding_type"] not in known:
            raise NeuroShardError(f"table '{name}': TorchRec has no sharding type {record['sharding_type']!r}")
    return exported["tables"]


def _torchrec_cache_params(name: str, record: dict) -> Any:
    """TorchRec's ``CacheParams`` of a record's ``cache_params`` (None without one)."""
    params = record.get("cache_params")
    if params is None:
        return None
    from torchrec.distributed.types import CacheAlgorithm, CacheParams
    load_factor, algorithm = params.get("load_factor"), params.get("algorithm")
    if isinstance(load_factor, bool) or not isinstance(load_factor, (int, float)) or not 0 < load_factor <= 1:
        raise NeuroShardError(f"table '{name}': cache_params.load_factor must be a number in (0, 1], "
                              f"got {load_factor!r}")
    if algorithm is not None and algorithm not in CacheAlgorithm.__members__:
        raise NeuroShardError(f"table '{name}': cache_params.algorithm must be one of "
                              f"{', '.join(CacheAlgorithm.__members__)}, got {algorithm!r}")
    return CacheParams(algorithm=None if algorithm is None else CacheAlgorithm[algorithm],
                       load_factor=float(load_factor))


class TorchRecExporter(Exporter):
    """``neuroshard export --format torchrec``: ``torchrec_sharding``'s document."""

    name = "torchrec"
    format = TORCHREC_FORMAT

    def export(self, plan: Plan, compute_device: str | None = None, compute_kernel: str = "fused",
               local_world_size: int | None = None, cache_load_factor: float | None = None,
               cache_algorithm: str | None = None, **_: Any) -> dict:
        return torchrec_sharding(plan, compute_device=compute_device, compute_kernel=compute_kernel,
                                 local_world_size=local_world_size, cache_load_factor=cache_load_factor,
                                 cache_algorithm=cache_algorithm)

    def describe(self, plan: Plan, document: dict) -> str:
        kinds: dict[str, int] = {}
        tiered: dict[str, int] = {}
        tiers = plan.tiers()
        for name, record in document["tables"].items():
            kinds[record["sharding_type"]] = kinds.get(record["sharding_type"], 0) + 1
            if not tiers[name].on_device:
                tiered[record["compute_kernel"]] = tiered.get(record["compute_kernel"], 0) + 1
        text = (f"{len(document['tables'])} tables for TorchRec over {plan.num_devices} ranks, "
                f"{document['local_world_size']} per host, on {document['compute_device']} ("
                + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")")
        if tiered:
            text += "; outside device memory: " + ", ".join(f"{n} {k}" for k, n in sorted(tiered.items()))
        return text


EXPORTER = TorchRecExporter()
