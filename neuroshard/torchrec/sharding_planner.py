"""``NeuroShardPlanner``: a TorchRec ``ShardingPlanner`` that plans with NeuroShard.

A TorchRec user swaps one class::

    planner = NeuroShardPlanner(topology=topology, batch_size=batch_size, constraints=constraints)
    plan = planner.collective_plan(model, sharders, pg)          # as EmbeddingShardingPlanner's
    model = DistributedModelParallel(model, plan=plan, sharders=sharders, ...)

The planner reads the tables from the model (``tables_from_module``: every
``EmbeddingBagCollection``), turns TorchRec's ``Topology``, batch size, constraints and
sharders into a NeuroShard task, searches it (``neuroshard.measured.api.measured_search``: the search
against the cost models, calibrated on this machine when asked) and hands back TorchRec's
``ShardingPlan`` built by the exporter ``neuroshard export --format torchrec`` uses
(``export.torchrec_sharding`` and ``export.to_parameter_shardings``): every table laid out
as TorchRec runs it exactly. The ``neuroshard.plan/v1`` plan it made is ``last_plan``, and
TorchRec's own planner's plan for the same task, scored beside ours, is ``last_comparison``
(``examples/torchrec_planner.py`` is a complete script).

TorchRec must be importable: importing this module without it raises a one-line
``NeuroShardError`` (``neuroshard.torchrec`` itself imports without TorchRec and loads this
module on first use of ``NeuroShardPlanner`` or ``tables_from_module``).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Mapping

import torch.distributed as dist
from torch import nn

from ..constants import COMM_ELEMENT_BYTES, DATA_PARALLEL, PRECISION_BYTES, SHARDING_TYPES, default_local_world_size
from ..costmodels import CostModels, resolve_cost_models
from ..errors import InfeasibleError, NeuroShardError
from ..measured.api import check_calibrate, measured_search
from ..optimizers import check_optimizer
from ..plan import Plan
from ..search.registry import get_algorithm
from ..tables import Table, TableSet
from ..topology import make_topology
from ..types import narrowest_cols
from ..units import format_bytes
from ..validate import check_int, check_seed
from .export import to_parameter_shardings, torchrec_sharding
from .guard import require_torchrec

require_torchrec()  # this module is TorchRec's planner interface: without TorchRec, one line and stop

from torchrec.distributed.comm import get_local_size  # noqa: E402
from torchrec.distributed.embedding_types import EmbeddingComputeKernel  # noqa: E402
from torchrec.distributed.planner.constants import BATCH_SIZE, POOLING_FACTOR  # noqa: E402
from torchrec.distributed.planner.types import ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.sharding_plan import get_default_sharders  # noqa: E402
from torchrec.distributed.types import (  # noqa: E402
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ShardingPlan,
    ShardingPlanner,
    ShardingType,
)
from torchrec.distributed.utils import get_device_type, optimizer_type_to_emb_opt_type  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection  # noqa: E402

log = logging.getLogger("neuroshard.torchrec")

#: TorchRec's default share of every device's memory held back for everything but the
#: embedding tables (``HeuristicalStorageReservation(percentage=0.15)``)
STORAGE_RESERVATION = 0.15
#: lookups per sample of one feature when neither its constraints nor ``access`` say (TorchRec's ``POOLING_FACTOR``)
DEFAULT_POOLING_FACTOR = float(POOLING_FACTOR)
#: the layouts neuroshard's plans take (TorchRec's names); ``table_column_wise`` is never planned
PLANNED_TYPES = frozenset(SHARDING_TYPES)
#: TorchRec's compute kernels of our plans: the fused TBE for sharded tables, dense for replicated ones
FUSED, DENSE = EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.DENSE.value
#: ``ParameterConstraints`` fields that set the kernel, not the placement: copied into the
#: ``ParameterSharding`` of their table as TorchRec's planner copies them
KERNEL_SETTINGS = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype")
#: the search's advice when the tables do not fit, in CLI flags (``constraints.check_capacity``)
_CAPACITY_ADVICE = re.compile(r"\(need at least (\d+) devices of this memory, or state host memory --host-memory "
                              r"or SSD --ssd[^)]*\)")
#: ``shard`` options the planner sets from TorchRec's objects (not to be given as search options)
FROM_TORCHREC = ("topology", "optimizer", "bytes_per_element", "devices", "memory", "tables")


@dataclass(frozen=True)
class TorchRecComparison:
    """Our plan beside the plan TorchRec's ``EmbeddingShardingPlanner`` makes for the same task
    (tables, ranks, memory, batch), both scored by the same cost models: each plan's max rank
    cost per iteration, in ms. ``theirs_ms`` is None when TorchRec's planner found no plan
    (``no_plan`` says why). An estimate by our cost models, not a measurement."""

    ours_ms: float
    theirs_ms: float | None
    our_shards: int
    their_shards: int | None
    no_plan: str | None = None

    @property
    def ratio(self) -> float | None:
        """``ours_ms / theirs_ms``: below 1 our plan is estimated faster (None without their plan)."""
        if self.theirs_ms is None:
            return None
        return self.ours_ms / self.theirs_ms if self.theirs_ms else float("nan")

    def format(self) -> str:
        """One line: the line ``NeuroShardPlanner`` logs after its stats."""
        if self.theirs_ms is None:
            return f"TorchRec's EmbeddingShardingPlanner on the same task: no plan ({self.no_plan})"
        return (f"TorchRec's EmbeddingShardingPlanner on the same task, scored by the same cost model: max rank cost "
                f"{self.theirs_ms:.4f} ms per iteration (ours {self.ours_ms:.4f} ms, {self.ratio:.3f}x; "
                f"{self.their_shards} shards against our {self.our_shards})")


def _where(path: str) -> str:
    return f"module '{path}'" if path else "the model itself"


def embedding_modules(module: nn.Module) -> list[tuple[str, EmbeddingBagCollection]]:
    """Every ``EmbeddingBagCollection`` in ``module`` with its module path (``named_modules``
    order; ``""`` when ``module`` is one). An ``EmbeddingCollection`` is refused (one line):
    sequence embeddings are not planned."""
    found = []
    for path, child in module.named_modules():
        if isinstance(child, EmbeddingCollection):
            raise NeuroShardError(f"{_where(path)} is an EmbeddingCollection (sequence embeddings), which "
                                  f"NeuroShardPlanner does not plan; plan it with TorchRec's EmbeddingShardingPlanner")
        if isinstance(child, EmbeddingBagCollection):
            found.append((path, child))
    if not found:
        raise NeuroShardError(f"no EmbeddingBagCollection in the {type(module).__name__} module: nothing to plan")
    return found


def tables_from_module(module: nn.Module, constraints: Mapping[str, ParameterConstraints] | None = None,
                       batch_size: int | None = None, world_size: int = 1,
                       access: str | Path | TableSet | None = None,
                       sharding_types: Collection[str] | Mapping[str, Collection[str]] | None = None,
                       compute_device: str | None = None) -> TableSet:
    """The tables of every ``EmbeddingBagCollection`` in ``module`` as a ``TableSet``.

    * One ``Table`` per ``EmbeddingBagConfig``: its name, ``num_embeddings`` and
      ``embedding_dim``; ``Table.extra["torchrec"]`` keeps the module path, the feature
      names and the data type. Two modules with a table of the same name are refused.
    * The batch: ``batch_size`` samples per rank (TorchRec's meaning; None: TorchRec's
      default, 512) times ``world_size``, the global batch our ``TableSet`` counts.
    * Lookups per sample (``pooling_factor``): the sum over the table's features of
      ``ParameterConstraints.pooling_factors`` x ``num_poolings`` when the table's constraints
      set them (not TorchRec's default ``[1.0]``), else the pooling factor of the table of
      the same name in ``access`` (a tables file or ``TableSet``), else
      ``DEFAULT_POOLING_FACTOR`` (1.0) per feature. A table shared by several features is
      one bag of all their lookups per sample: its compute is counted in full, its all-to-all
      as one bag (TorchRec sends one per feature).
    * Access statistics: those of the table of the same name in ``access``, else none:
      uniform lookups (our default). ``extra["torchrec"]["defaults"]`` lists the tables that
      took a default pooling factor or access statistics.
    * Constraints, TorchRec's rules in ours (``Table.constraints``): the sharding types of
      ``ParameterConstraints.sharding_types``, of ``sharding_types`` (those the sharders
      allow, for every module or by module path) and of those neuroshard plans
      (``PLANNED_TYPES``), intersected; ``compute_kernels`` must include ``fused`` (our plans'
      kernel; ``dense`` for a table allowed only ``data_parallel``); ``min_partition`` is
      honoured where it forbids column splits (over half the width) or allows every strip
      we cut (at most ``types.narrowest_cols``); ``batch_sizes`` must be the batch per rank;
      ``device_group`` must be ``compute_device``; ``key_value_params`` and
      ``use_virtual_table`` (SSD and virtual tables) are not planned. The kernel settings
      (``KERNEL_SETTINGS``) and ``is_weighted`` do not change placement. A constraint that
      cannot be honoured, or constraints naming a table the model lacks, raise one line
      naming the table.

    An ``EmbeddingCollection`` (sequence embeddings) is refused: not planned.
    """
    per_rank = BATCH_SIZE if batch_size is None else check_int(batch_size, "batch_size (per rank)", 1)
    world_size = check_int(world_size, "world_size", 1)
    constraints = dict(constraints or {})
    known = _access_tables(access)
    modules = embedding_modules(module)
    tables: list[Table] = []
    where: dict[str, str] = {}
    defaults: dict[str, list[str]] = {"pooling_factor": [], "access": []}
    for path, ebc in modules:
        allowed = sharding_types.get(path) if isinstance(sharding_types, Mapping) else sharding_types
        for config in ebc.embedding_bag_configs():
            name = config.name
            if name in where:
                raise NeuroShardError(f"table '{name}' is in two EmbeddingBagCollections, {_where(where[name])} and "
                                      f"{_where(path)}; TorchRec plans tables by name: rename one")
            where[name] = path
            features = list(config.feature_names)
            rule = constraints.get(name)
            if rule is not None and rule.batch_sizes is not None and any(b != per_rank for b in rule.batch_sizes):
                raise NeuroShardError(f"table '{name}': constraints.batch_sizes {list(rule.batch_sizes)} differ from "
                                      f"the batch of {per_rank} per rank; neuroshard plans one batch for all features")
            pooling = _pooling_factor(name, features, rule)
            if pooling is None and name in known:
                pooling = known[name].pooling_factor
            elif pooling is None:
                defaults["pooling_factor"].append(name)
                pooling = DEFAULT_POOLING_FACTOR * len(features)
            if name not in known:
                defaults["access"].append(name)
            source = known.get(name)
            extra = {"torchrec": {"module": path, "features": features, "data_type": config.data_type.value}}
            tables.append(Table(name, int(config.num_embeddings), int(config.embedding_dim), float(pooling),
                                dict(source.access) if source is not None else {}, extra,
                                base_dir=source.base_dir if source is not None else None,  # access.indices files
                                constraints=_constraints(name, path, int(config.embedding_dim), rule, allowed,
                                                         compute_device)))
    unknown = sorted(set(constraints) - set(where))
    if unknown:
        raise NeuroShardError(f"constraints name table '{unknown[0]}', which no EmbeddingBagCollection in the model "
                              f"has (tables: {', '.join(list(where)[:6])}{' ...' if len(where) > 6 else ''})")
    info = {"batch_size_per_rank": per_rank, "world_size": world_size, "modules": [p for p, _ in modules],
            "defaults": defaults}
    return TableSet(type(module).__name__, tables, per_rank * world_size, {"torchrec": info})


def _access_tables(access: str | Path | TableSet | None) -> dict[str, Table]:
    if access is None:
        return {}
    if isinstance(access, (str, Path)):
        access = TableSet.read(access)
    if not isinstance(access, TableSet):
        raise NeuroShardError(f"access must be a tables file or a TableSet, got {type(access).__name__}")
    return {t.name: t for t in access}


def _pooling_factor(name: str, features: list[str], rule: ParameterConstraints | None) -> float | None:
    """Lookups per sample from the table's constraints; None when they do not set it."""
    if rule is None:
        return None
    if list(rule.pooling_factors) == [POOLING_FACTOR] and rule.num_poolings is None:
        return None  # TorchRec's default: the table's constraints say nothing about its lookups
    factors = list(rule.pooling_factors)
    poolings = list(rule.num_poolings) if rule.num_poolings is not None else [1.0] * len(factors)
    if len(factors) != len(features) or len(poolings) != len(features):
        raise NeuroShardError(f"table '{name}': constraints.pooling_factors ({len(factors)}) and num_poolings "
                              f"({len(poolings)}) must give one number per feature ({len(features)}: "
                              f"{', '.join(features[:4])})")
    return float(sum(p * n for p, n in zip(factors, poolings)))


def _constraints(name: str, path: str, dim: int, rule: ParameterConstraints | None,
                 allowed: Collection[str] | None, compute_device: str | None) -> dict:
    """The table's constraints in the tables format (``{}``: none), from TorchRec's rules."""
    kinds = set(PLANNED_TYPES) if allowed is None else set(allowed) & PLANNED_TYPES
    here = f"table '{name}' ({_where(path)})"
    if rule is not None:
        known = {t.value for t in ShardingType}
        if rule.sharding_types is not None:
            bad = [k for k in rule.sharding_types if k not in known]
            if bad:
                raise NeuroShardError(f"{here}: constraints.sharding_types names {bad[0]!r}, not a TorchRec sharding "
                                      f"type ({', '.join(sorted(known))})")
            kinds &= set(rule.sharding_types)
        if rule.key_value_params is not None or rule.use_virtual_table:
            raise NeuroShardError(f"{here}: constraints ask for an SSD or virtual table (key_value_params, "
                                  f"use_virtual_table), which neuroshard does not plan")
        if rule.device_group is not None and compute_device is not None and rule.device_group != compute_device:
            raise NeuroShardError(f"{here}: constraints.device_group is {rule.device_group!r}, but the topology's "
                                  f"devices are {compute_device!r}; neuroshard plans one kind of device")
        if rule.min_partition is not None:
            if rule.min_partition > dim // 2:  # no column split keeps every strip that wide
                kinds -= {"column_wise", "grid_shard"}
            elif rule.min_partition > narrowest_cols(dim):
                raise NeuroShardError(f"{here}: constraints.min_partition {rule.min_partition} cannot be honoured: "
                                      f"neuroshard halves a table's {dim} columns down to strips of "
                                      f"{narrowest_cols(dim)}; give at most {narrowest_cols(dim)}, or more than "
                                      f"{dim // 2} (no column split)")
        if rule.compute_kernels is not None:
            kernels = set(rule.compute_kernels)
            if FUSED not in kernels and not (kinds == {DATA_PARALLEL} and DENSE in kernels):
                raise NeuroShardError(f"{here}: constraints.compute_kernels {list(rule.compute_kernels)} exclude "
                                      f"'{FUSED}', the kernel of neuroshard's sharded tables ('{DENSE}' only for a "
                                      f"table allowed only data_parallel)")
            if DENSE not in kernels:
                kinds.discard(DATA_PARALLEL)
    if not kinds:
        theirs = "any" if rule is None or rule.sharding_types is None else sorted(rule.sharding_types)
        sharders = "any" if allowed is None else sorted(allowed)
        raise NeuroShardError(f"{here}: no sharding type is left: its constraints allow {theirs}, the sharders "
                              f"{sharders}, neuroshard plans {sorted(PLANNED_TYPES)}")
    if kinds == PLANNED_TYPES:
        return {}
    return {"sharding_types": [k for k in SHARDING_TYPES if k in kinds]}


class NeuroShardPlanner(ShardingPlanner):
    """TorchRec's ``ShardingPlanner`` interface (``plan``, ``collective_plan``), planned by
    NeuroShard: a drop-in for ``EmbeddingShardingPlanner`` over ``EmbeddingBagCollection``s.

    TorchRec's arguments, as ``EmbeddingShardingPlanner`` takes them (the same names, in the
    same positional order, so a script swaps the class and nothing else). Its search parts
    (``enumerator``, ``proposer``, ``partitioner``, ``performance_model``, ``stats``,
    ``callbacks``, ``timeout_seconds``, ``plan_loader``) are accepted and ignored with one
    warning: NeuroShard's search replaces them; ``debug`` is accepted (``log_stats`` switches
    our stats). The rest:

    * ``topology``: world size, local world size (ranks per host), compute device and per-device
      memory: HBM on ``cuda`` (``hbm_cap``: each GPU's memory), DDR on ``cpu`` (``ddr_cap``,
      each rank's host memory); per-device capacities are honoured. None: TorchRec's default
      (``torch.distributed``'s world size, ``LOCAL_WORLD_SIZE``, ``cuda`` when available),
      built at construction as TorchRec does. One host of all ranks is searched on the network
      the communication models measured, as ``shard`` with no topology; several hosts (and one
      host of 16, 24, ... ranks, which our default would cut into hosts of 8) are stated to the
      search with the topology's ``intra_host_bw`` and ``inter_host_bw``.
    * ``batch_size``: samples per rank (None: TorchRec's 512); the search's global batch is
      ``batch_size x world_size``.
    * ``constraints``: ``ParameterConstraints`` by table name, translated by
      ``tables_from_module`` (what is honoured and what is refused is listed there).
    * ``storage_reservation``: the share of every device's memory kept back for all but the
      embedding tables (dense parameters, activations, buffers), as TorchRec's
      ``HeuristicalStorageReservation`` percentage (None: TorchRec's default, 0.15): the search gets
      ``capacity x (1 - storage_reservation)`` per device for the tables' weights and their
      optimizer's state. A float, or TorchRec's ``FixedPercentageStorageReservation`` /
      ``HeuristicalStorageReservation`` (their percentage is used). TorchRec's heuristic
      further subtracts its estimate of the dense part and the input KJTs, and reserves
      HBM only; here the percentage is all, applied to HBM on ``cuda`` and DDR on ``cpu``.

    The sharders (``plan``'s argument; None: TorchRec's defaults) decide the sharding types:
    those ``sharder.sharding_types(compute_device)`` lists whose kernels include ``fused``
    (``dense`` for ``data_parallel``); on ``cpu`` TorchRec's ``EmbeddingBagCollectionSharder``
    lists no row-wise types. Every ``EmbeddingBagCollection`` needs a sharder of its type.
    Embedding optimizer (its state counts in memory): the one ``apply_optimizer_in_backward``
    attached to a table's weight, else the sharder's ``fused_params["optimizer"]``, else SGD
    (sgd, adagrad, rowwise-adagrad and adam are known; another is refused naming the table).
    Weights precision: the tables' ``data_type`` (fp32, fp16, bf16, int8; one for all).

    Ours: ``cost_models`` (a ``CostModels``, a checkpoint path, or None for the shipped one),
    ``algorithm`` (a registered search), ``calibrate`` (random sets timed on this machine to
    calibrate the cost models first; None: off), ``seed``, ``access`` (a tables file or
    ``TableSet`` giving each table's pooling factor and access statistics by name),
    ``log_stats`` (the plan's summary on logger ``neuroshard.torchrec`` at INFO),
    ``compare_torchrec`` (also plan the task with TorchRec's ``EmbeddingShardingPlanner`` and
    score its plan by the same cost models beside ours: kept as ``last_comparison`` and logged
    after the stats; None, the default: when ``log_stats``; that planner takes a minute or
    more for hundreds of tables), and
    ``options`` for the search (e.g. ``data_parallel="auto"``, ``comm_precision="fp16"``,
    ``beam_width=4``; the all-to-all is estimated at fp32 unless ``comm_precision`` says).

    ``last_plan`` is the ``neuroshard.plan/v1`` ``Plan`` of the last ``plan`` or
    ``collective_plan`` (``last_plan.write(path)``, then ``neuroshard plan show path``), and
    ``last_comparison`` its ``TorchRecComparison`` with TorchRec's plan (None when not compared);
    ``collective_plan`` gives both to every rank.
    Not honoured: TorchRec's enumerator, proposers, partitioner, performance model, stats and
    callbacks (ours search instead), ``table_column_wise``, and caching, UVM or SSD kernels.
    """

    def __init__(self, topology: Topology | None = None, batch_size: int | None = None, enumerator: Any = None,
                 storage_reservation: Any = None, proposer: Any = None, partitioner: Any = None,
                 performance_model: Any = None, stats: Any = None,
                 constraints: Mapping[str, ParameterConstraints] | None = None, debug: bool = True,
                 callbacks: Any = None, timeout_seconds: int | None = None, plan_loader: Any = None, *,
                 cost_models: CostModels | str | Path | None = None, algorithm: str = "neuroshard",
                 calibrate: int | None = None, seed: int = 0, access: str | Path | TableSet | None = None,
                 log_stats: bool = True, compare_torchrec: bool | None = None, **options: Any) -> None:
        if topology is None:
            topology = _default_topology()
        if not isinstance(topology, Topology):
            raise NeuroShardError(f"topology must be TorchRec's Topology, got {type(topology).__name__}")
        if topology.compute_device not in ("cpu", "cuda"):
            raise NeuroShardError(f"topology's compute device is {topology.compute_device!r}; NeuroShardPlanner "
                                  f"plans for cpu or cuda")
        given = sorted(set(options) & set(FROM_TORCHREC))
        if given:
            raise NeuroShardError(f"option {given[0]!r} comes from TorchRec's objects (topology, tables' data_type, "
                                  f"optimizer); leave it out")
        self._topology = topology
        self._batch_size = BATCH_SIZE if batch_size is None else check_int(batch_size, "batch_size (per rank)", 1)
        self._constraints = dict(constraints or {})
        self._cost_models = cost_models
        get_algorithm(algorithm)  # an unknown name fails here
        self._algorithm = algorithm
        self._calibrate = 0 if calibrate is None else check_calibrate(calibrate)
        self._seed = check_seed(seed)
        self._access = TableSet.read(access) if isinstance(access, (str, Path)) else access
        if self._access is not None and not isinstance(self._access, TableSet):
            raise NeuroShardError(f"access must be a tables file or a TableSet, got {type(access).__name__}")
        self._reservation = _reservation(STORAGE_RESERVATION if storage_reservation is None else storage_reservation)
        theirs = {"enumerator": enumerator, "proposer": proposer, "partitioner": partitioner,
                  "performance_model": performance_model, "stats": stats, "callbacks": callbacks,
                  "timeout_seconds": timeout_seconds, "plan_loader": plan_loader}
        ignored = [name for name, value in theirs.items() if value is not None]
        if ignored:  # the parts of TorchRec's search NeuroShard's search replaces
            log.warning("NeuroShardPlanner ignores %s: TorchRec's search parts, replaced by NeuroShard's search",
                        ", ".join(ignored))
        self._debug = bool(debug)  # TorchRec's stats table switch: ours is log_stats
        self._log_stats = bool(log_stats)
        self._compare_torchrec = self._log_stats if compare_torchrec is None else bool(compare_torchrec)
        self._options = dict(options)
        self.last_plan: Plan | None = None
        self.last_comparison: TorchRecComparison | None = None

    # ------------------------------------------------------------------ TorchRec's interface
    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None = None) -> ShardingPlan:
        """The sharding plan of every ``EmbeddingBagCollection`` in ``module``, keyed by module
        path; ``last_plan`` is ours. One-line NeuroShardError for what cannot be planned."""
        sharders = list(sharders) if sharders is not None else get_default_sharders()
        device = self._topology.compute_device
        world = self._topology.world_size
        modules = embedding_modules(module)
        chosen = {path: _sharder_of(path, ebc, sharders) for path, ebc in modules}
        tables = tables_from_module(module, self._constraints, self._batch_size, world, self._access,
                                    {path: _planned_types(sharder, device) for path, sharder in chosen.items()},
                                    device)
        by_path = dict(modules)
        optimizer = _one(tables, "optimizer", lambda t: _optimizer_of(t.name, by_path[_path(t)], chosen[_path(t)]))
        bytes_per_element = _one(tables, "weights precision", _bytes_per_element)
        memory = self._memory()
        models = self._models()
        try:
            plan = measured_search(tables, world, memory, self._algorithm, models, bytes_per_element, self._seed,
                                   self._calibrate, topology=self._our_topology(), optimizer=optimizer,
                                   **self._options)
        except InfeasibleError as exc:  # the search's advice names CLI flags; say this planner's arguments
            raise InfeasibleError(self._planner_advice(str(exc))) from None
        sharding_plan = self._sharding_plan(plan)
        self.last_plan = plan
        self.last_comparison = None
        if self._compare_torchrec:
            self.last_comparison = self._compare(plan, tables, world, memory, models, bytes_per_element, optimizer)
        if self._log_stats:
            stats = self._stats(plan, tables)
            if self.last_comparison is not None:
                stats += "\n" + self.last_comparison.format()
            log.info("%s", stats)
        return sharding_plan

    def collective_plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None = None,
                        pg: dist.ProcessGroup | None = None) -> ShardingPlan:
        """``plan`` on rank 0 of ``pg`` (None: the default group), broadcast to every rank with
        ``torch.distributed.broadcast_object_list``, as ``EmbeddingShardingPlanner`` does; every
        rank gets the same ``ShardingPlan`` and ``last_plan``. An error on rank 0 is raised on
        every rank (one line), not left to hang the others. ``last_comparison`` is rank 0's."""
        if pg is None:
            if not dist.is_initialized():
                raise NeuroShardError("collective_plan needs torch.distributed initialized "
                                      "(init_process_group); outside a process group use plan()")
            pg = dist.GroupMember.WORLD
        sharders = list(sharders) if sharders is not None else get_default_sharders()
        payload: list[Any] = [None]
        error: BaseException | None = None
        if pg.rank() == 0:
            try:
                sharding_plan = self.plan(module, sharders)
                payload = [(sharding_plan, self.last_plan.to_dict(), self.last_comparison, None)]
            except Exception as exc:  # every rank raises it: none waits on a broadcast that never comes
                error = exc
                payload = [(None, None, None, (isinstance(exc, NeuroShardError), f"{type(exc).__name__}: {exc}"))]
        if pg.size() > 1:
            dist.broadcast_object_list(payload, group=pg, group_src=0)
        sharding_plan, plan, comparison, failed = payload[0]
        if error is not None:
            raise error
        if failed is not None:
            ours, message = failed
            raise (NeuroShardError if ours else RuntimeError)(f"planning on rank 0 failed: {message}")
        if pg.rank() != 0:
            self.last_plan = Plan.from_dict(plan, source="rank 0's plan")
            self.last_comparison = comparison
        return sharding_plan

    # ------------------------------------------------------------------ the task
    def _models(self) -> CostModels:
        """The cost models, resolved (a checkpoint loaded) once."""
        if not isinstance(self._cost_models, CostModels):
            self._cost_models = resolve_cost_models(self._cost_models)
        return self._cost_models

    def _capacities(self) -> list[int]:
        """Each device's memory the topology gives: HBM on cuda, DDR on cpu."""
        hbm = self._topology.compute_device == "cuda"
        return [int(d.storage.hbm if hbm else d.storage.ddr) for d in self._topology.devices]

    def _planner_advice(self, message: str) -> str:
        """``message`` with the search's advice in CLI flags (more devices, or host memory or
        SSD behind device caches, which this planner does not plan) said in the arguments a
        NeuroShardPlanner user changes: the Topology's world_size and memory cap, and the
        storage reservation."""
        kind = "hbm" if self._topology.compute_device == "cuda" else "ddr"
        return _CAPACITY_ADVICE.sub(
            lambda m: f"(need at least {m.group(1)} ranks of this memory: the Topology's world_size; or more "
                      f"memory per rank: its {kind}_cap, of which storage_reservation keeps back "
                      f"{self._reservation:g})", message)

    def _memory(self) -> int | list[int]:
        """Memory per device for the tables: capacity x (1 - storage reservation)."""
        sizes = [int(c * (1.0 - self._reservation)) for c in self._capacities()]
        if min(sizes) < 1:
            kind = "hbm" if self._topology.compute_device == "cuda" else "ddr"
            raise NeuroShardError(f"the topology gives a device no {kind} memory for the tables ({kind}_cap "
                                  f"{format_bytes(min(self._capacities()))}, storage reservation {self._reservation:g})")
        return sizes[0] if len(set(sizes)) == 1 else sizes

    def _our_topology(self):
        """Our topology: None for one host of TorchRec's default size (the measured network),
        else hosts and TorchRec's link bandwidths (bytes/ms -> GB/s)."""
        world, local = self._topology.world_size, self._topology.local_world_size
        if local == world == default_local_world_size(world):
            return None
        return make_topology(world, local, self._topology.intra_host_bw / 1e6, self._topology.inter_host_bw / 1e6,
                             source="TorchRec's Topology")

    def _sharding_plan(self, plan: Plan) -> ShardingPlan:
        """TorchRec's ``ShardingPlan`` of ``plan``: the export's records as real
        ``ParameterSharding`` objects (checked to tile each table), by module path, with the
        kernel settings of the tables' constraints."""
        document = torchrec_sharding(plan, compute_device=self._topology.compute_device, compute_kernel=FUSED,
                                     local_world_size=self._topology.local_world_size)
        shardings = to_parameter_shardings(document, {t.name: (t.num_embeddings, t.embedding_dim)
                                                      for t in plan.tables})
        modules: dict[str, EmbeddingModuleShardingPlan] = {}
        for table in plan.tables:
            sharding = shardings[table.name]
            rule = self._constraints.get(table.name)
            for key in KERNEL_SETTINGS:
                value = getattr(rule, key, None)
                if value is not None:
                    setattr(sharding, key, value)
            modules.setdefault(_path(table), EmbeddingModuleShardingPlan())[table.name] = sharding
        return ShardingPlan(modules)

    # ------------------------------------------------------------------ stats
    def _compare(self, plan: Plan, tables: TableSet, world: int, memory: Any, models: CostModels,
                 bytes_per_element: int, optimizer: str) -> TorchRecComparison:
        """TorchRec's own planner on the same task (the ``torchrec`` search algorithm: its
        ``EmbeddingShardingPlanner``, its plan scored by our cost models), beside ours."""
        ours = float((plan.estimate or {}).get("max_device_cost_ms", float("nan")))
        try:
            theirs = measured_search(tables, world, memory, "torchrec", models, bytes_per_element, self._seed,
                                     topology=self._our_topology(), optimizer=optimizer,
                                     compute_device=self._topology.compute_device)
        except InfeasibleError as exc:
            why = self._planner_advice(str(exc).splitlines()[0])
            return TorchRecComparison(ours, None, len(plan.shards), None, why)
        return TorchRecComparison(ours, float(theirs.estimate["max_device_cost_ms"]), len(plan.shards),
                                  len(theirs.shards))

    def _stats(self, plan: Plan, tables: TableSet) -> str:
        """The plan at a glance: what the estimate is for, then per rank its shards,
        estimated cost, memory and all-to-all bytes."""
        info = tables.extra["torchrec"]
        world = plan.num_devices
        estimate = plan.estimate or {}
        device = self._topology.compute_device
        lines = [f"NeuroShardPlanner: {len(plan.tables)} tables of {len(info['modules'])} module(s) "
                 f"({', '.join(p or '<root>' for p in info['modules'])}) on {world} ranks ({device}, "
                 f"{self._topology.local_world_size} per host), algorithm {self._algorithm}, seed {self._seed}",
                 f"estimate for a batch of {tables.batch_size} ({info['batch_size_per_rank']} per rank x {world}): "
                 f"max rank cost {estimate.get('max_device_cost_ms', float('nan')):.4f} ms per iteration",
                 *(f"  {line}" for line in plan.estimate_sources()),  # each term's model and hardware
                 f"memory per rank for the tables: {_sizes(plan.memory_limits())} ({device} "
                 f"{'hbm' if device == 'cuda' else 'ddr'} {_sizes(self._capacities())} x (1 - {self._reservation:g} "
                 f"reserved)); optimizer {plan.optimizer}; weights {plan.bytes_per_element} bytes per element"]
        pooled, stats = info["defaults"]["pooling_factor"], info["defaults"]["access"]
        if pooled:
            lines.append(f"default pooling factor ({DEFAULT_POOLING_FACTOR:g} lookup per sample per feature) for "
                         f"{_names(pooled)}")
        if stats:
            lines.append(f"default access statistics (uniform lookups) for {_names(stats)}")
        if plan.data_parallel_tables:
            lines.append(f"replicated on every rank (data_parallel): {', '.join(plan.data_parallel_tables)}")
        used = plan.memory_used_bytes()
        element = COMM_ELEMENT_BYTES[plan.comm_precision]
        costs = {key: estimate.get(f"per_device_{key}_ms") for key in ("cost", "compute", "fwd_comm", "bwd_comm")}
        for rank in range(world):
            shards = sorted(plan.shards_on(rank), key=lambda s: (s.table, s.col_offset, s.row_offset))
            width = sum(s.num_cols for s in shards)
            # each rank sends its pooled columns of every other rank's samples (the gradients come back alike)
            sent = tables.batch_size * (world - 1) // world * width * element
            cost = "" if costs["cost"] is None else (
                f"cost {costs['cost'][rank]:.4f} ms (compute {costs['compute'][rank]:.4f}, all-to-all "
                f"{costs['fwd_comm'][rank] + costs['bwd_comm'][rank]:.4f}); ")
            lines.append(f"rank {rank}: {cost}memory {format_bytes(used[rank])} of "
                         f"{format_bytes(plan.memory_limits()[rank])}; all-to-all {format_bytes(sent)} sent per "
                         f"direction; {len(shards)} shards: " + ", ".join(_shard_text(s, plan) for s in shards))
        return "\n".join(lines)


# ---------------------------------------------------------------------- helpers
def _default_topology() -> Topology:
    """TorchRec's default topology of this process group (``EmbeddingPlannerBase``)."""
    if not dist.is_initialized():
        raise NeuroShardError("topology is None and torch.distributed is not initialized: give TorchRec's "
                              "Topology(world_size=..., compute_device=...)")
    return Topology(world_size=dist.get_world_size(), local_world_size=get_local_size(),
                    compute_device=get_device_type())


def _reservation(value: Any) -> float:
    """A storage reservation as a fraction in [0, 1)."""
    fraction = getattr(value, "_percentage", value)  # TorchRec's percentage reservations keep it here
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
        raise NeuroShardError(f"storage_reservation must be a fraction in [0, 1) or TorchRec's percentage "
                              f"storage reservation, got {value!r}")
    return float(fraction)


def _sharder_of(path: str, ebc: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ModuleSharder[nn.Module]:
    """The sharder of ``ebc``'s type (TorchRec matches the exact type)."""
    for sharder in sharders:
        if sharder.module_type is type(ebc):
            return sharder
    raise NeuroShardError(f"{_where(path)} ({type(ebc).__name__}) has no sharder among the "
                          f"{len(sharders)} given; add EmbeddingBagCollectionSharder()")


def _planned_types(sharder: ModuleSharder[nn.Module], device: str) -> set[str]:
    """The sharder's sharding types on ``device`` that run with our plans' kernels."""
    return {kind for kind in sharder.sharding_types(device)
            if (DENSE if kind == DATA_PARALLEL else FUSED) in sharder.compute_kernels(kind, device)}


def _path(table: Table) -> str:
    return table.extra["torchrec"]["module"]


def _one(tables: TableSet, what: str, value_of) -> Any:
    """The value every table shares (one line naming two tables that differ)."""
    values = {t.name: value_of(t) for t in tables}
    first = tables[0].name
    for name, value in values.items():
        if value != values[first]:
            raise NeuroShardError(f"table '{name}' has {what} {value!r} but table '{first}' has "
                                  f"{values[first]!r}; neuroshard plans one {what} for all tables")
    return values[first]


def _bytes_per_element(table: Table) -> int:
    data_type = table.extra["torchrec"]["data_type"]
    if data_type.lower() not in PRECISION_BYTES:
        raise NeuroShardError(f"table '{table.name}': data type {data_type} is not planned (known: "
                              f"{', '.join(p.upper() for p in PRECISION_BYTES)})")
    return PRECISION_BYTES[data_type.lower()]


def _optimizer_of(name: str, ebc: nn.Module, sharder: ModuleSharder[nn.Module]) -> str:
    """The table's embedding optimizer: its weight's in-backward optimizer, else the sharder's
    ``fused_params["optimizer"]``, else SGD."""
    weight = ebc.embedding_bags[name].weight
    classes = getattr(weight, "_optimizer_classes", None)
    kind = None
    if classes:
        try:
            kind = optimizer_type_to_emb_opt_type(classes[0])
        except ValueError:
            raise NeuroShardError(f"table '{name}': optimizer {classes[0].__name__} has no fused kernel "
                                  f"(TorchRec's optimizer_type_to_emb_opt_type)") from None
    if kind is None:
        kind = (getattr(sharder, "fused_params", None) or {}).get("optimizer")
    if kind is None:
        return "sgd"
    return check_optimizer(str(getattr(kind, "name", kind)).lower(), f"table '{name}': optimizer")


def _sizes(values: list[int]) -> str:
    distinct = sorted(set(values))
    return format_bytes(distinct[0]) if len(distinct) == 1 else "/".join(format_bytes(v) for v in values)


def _names(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _shard_text(shard, plan: Plan) -> str:
    """``t0 101x16``, with the offsets when the shard is part of its table."""
    table = plan.table(shard.table)
    text = f"{shard.table} {shard.num_rows}x{shard.num_cols}"
    if (shard.num_rows, shard.num_cols) != (table.num_embeddings, table.embedding_dim):
        text += f" at ({shard.row_offset},{shard.col_offset})"
    return text


__all__ = ["NeuroShardPlanner", "TorchRecComparison", "tables_from_module", "embedding_modules",
           "STORAGE_RESERVATION", "DEFAULT_POOLING_FACTOR"]
