"""``search_plan(tables, devices=, memory=)`` -> a validated ``Plan``, searched against the cost models alone
(``neuroshard.shard``, the one call most users need, adds the measured loop)."""
from __future__ import annotations

import datetime as _dt
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import (
    DEFAULT_DATA_PARALLEL,
    DEFAULT_ROW_BLOCKS,
    FP32_BYTES,
    ITERATION_TIE_MARGIN,
    OBJECTIVES,
    precision_of,
)
from ..constraints import check_capacity
from ..constraints import check_feasible as check_constraints_feasible
from ..costmodels import CostModels, resolve_cost_models
from ..costmodels.dense import OperatorModels, load_operator_models
from ..costmodels.samples.tiers import as_measurement
from ..errors import NeuroShardError
from ..model_spec import DEFAULT_MODEL, ModelSpec
from ..optimizers import DEFAULT_OPTIMIZER, check_optimizer, row_bytes
from ..plan import Plan
from ..tables import Table, TableSet
from ..topology import device_memory, ranks_per_host, resolve_topology
from ..types import Placement, whole_pieces
from ..validate import (
    MAX_LOOKUPS_PER_BATCH,
    MAX_TABLES,
    check_batch_size,
    check_bytes_per_element,
    check_comm_precision,
    check_devices,
    check_row_blocks,
    check_seed,
)
from ..version import __version__
from .baselines import GREEDY_KEYS
from .iteration import estimate_iteration
from .neuroshard import HALF_HEAVY_SHARE
from .registry import REPLICATING_ALGORITHMS, get_algorithm, get_trait, make_params, with_trait
from .replicate import check_data_parallel, forced_tables, search_with_replication
from .rowwise import written_layout
from .simulator import Simulator, replicated_bytes
from .tiers import choose_tiers

log = logging.getLogger(__name__)

#: tables x devices from which a search warns that it may take minutes
LARGE_TASK = 2**18

COST_OPTIMIZER = "sgd"
"""The optimizer the cost models' kernels were timed with (exact SGD fused into the backward):
estimates are for it whatever ``optimizer`` the memory check counts the state of."""

COST_PRECISION = "fp32"
"""The element type the shipped cost models' kernels were timed with. Estimates are for the
plan's weights precision where a measured ratio carries them there (fp16, ``costmodels.precision``),
else (int8, 8 bytes) for the models' precision: the plan's provenance says which."""


def search_placement(sim: Simulator, memory_bytes: int, algorithm: str = "neuroshard", seed: int = 0,
                     **params: Any) -> Placement:
    """Run one registered algorithm on a simulator (the simulator's caches carry over between calls)."""
    chosen = get_algorithm(algorithm)
    return chosen.search(sim, memory_bytes, make_params(chosen, params), seed)


def as_table_set(tables: TableSet | list[Table]) -> TableSet:
    """A TableSet from a TableSet, a tables file path, or a list of tables (checked)."""
    if isinstance(tables, (str, Path)):
        tables = TableSet.read(tables)
    elif not isinstance(tables, TableSet):
        try:
            listed = list(tables)
        except TypeError:
            raise NeuroShardError(f"tables must be a TableSet, a tables file or a list of Table, "
                                  f"got {type(tables).__name__}") from None
        if not all(isinstance(t, Table) for t in listed):
            raise NeuroShardError("tables must be a TableSet, a tables file or a list of Table")
        tables = TableSet("tables", listed)
    if not len(tables):
        raise NeuroShardError("no tables to shard")
    if len(tables) > MAX_TABLES:
        raise NeuroShardError(f"{len(tables)} tables, over the limit of {MAX_TABLES} (MAX_TABLES)")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise NeuroShardError("tables must have distinct names")
    check_batch_size(tables.batch_size, f"tables '{tables.name}': batch_size")
    for t in tables:  # tables built in Python skip the file checks: check the same bounds here
        Table.from_dict(t.to_dict(), where=f"tables '{tables.name}': table")
        if tables.batch_size * t.pooling_factor > MAX_LOOKUPS_PER_BATCH:
            raise NeuroShardError(f"tables '{tables.name}': table '{t.name}': pooling factor {t.pooling_factor:g} "
                                  f"x batch size {tables.batch_size} is over {MAX_LOOKUPS_PER_BATCH} lookups per "
                                  f"batch (MAX_LOOKUPS_PER_BATCH)")
    return tables


def make_plan(sim: Simulator, placement: Placement, memory_bytes: int, algorithm: str, search_time_s: float) -> Plan:
    """A validated plan carrying the simulator's estimate (with the batch size it is for)
    and the search's provenance. Row-split tables are first laid out as TorchRec runs
    them (``rowwise.runnable_row_splits``: blocks in rank order, else re-cut or joined);
    with ``row_blocks="any"`` only aligned (``rowwise.align_row_blocks``: a strip's blocks on one
    device joined), as NeuroShard's runtime runs them."""
    room = sim.memory_limits(memory_bytes) - replicated_bytes(sim, sim.data_parallel_tables)  # what shards may use
    pieces, devices = written_layout(sim, placement.pieces, placement.devices, room, quiet=False)
    placement = Placement(pieces, devices, placement.cost_ms, placement.details)
    estimate = sim.plan_estimate(sim.evaluate(placement.pieces, placement.devices[None, :], risk=0.0))  # the mean
    models = sim.cost_models
    provenance = {"algorithm": algorithm, "parameters": placement.details.get("parameters", {}),
                  "cost_model": models.name,
                  "cost_model_batch_size": models.batch_size,
                  "cost_model_hardware": models.describe_hardware(),
                  "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  "search_time_s": round(search_time_s, 4)}
    if getattr(models, "path", None):
        provenance["cost_model_path"] = str(models.path)
    provenance["neuroshard_version"] = __version__
    if sim.row_blocks != DEFAULT_ROW_BLOCKS:  # row splits TorchRec does not run may be in the plan
        provenance["row_blocks"] = sim.row_blocks
    if sim.risk:  # an ensemble: the search charged mean x exp(risk x spread) per device set
        provenance["risk"] = sim.risk
    if sim.bytes_per_element != 4 or sim.cost_precision != COST_PRECISION:  # what the estimate's compute is for
        provenance["cost_precision"] = sim.cost_precision
        provenance.update(sim.precision_provenance)
    if sim.optimizer != DEFAULT_OPTIMIZER:  # its state counts in memory; costs are the SGD-measured kernels'
        provenance["cost_optimizer"] = COST_OPTIMIZER
    if sim.topology is not None:  # the cluster the plan is for (also in the plan's topology field)
        provenance["topology"] = sim.topology.describe()
    provenance["comm_model"] = sim.comm_source  # measured model, stated links, or the defaults at scale
    if sim.tiers is not None:  # rows in host memory or on SSD: which, and how their traffic was costed
        provenance["tiers"] = sim.tier_record
    if "data_parallel" in placement.details:  # data_parallel="auto": what was replicated, and why
        provenance["data_parallel"] = placement.details["data_parallel"]
    if "fallback" in placement.details:  # the search could not pack: a baseline's plan, and why
        provenance["fallback"] = placement.details["fallback"]
    splits = split_reasons(sim, placement, memory_bytes, algorithm)
    if splits:  # why each split table was split (``plan.SPLIT_REASONS``)
        provenance["splits"] = splits
    plan = Plan(list(sim.tables.tables), sim.to_shards(placement.pieces, placement.devices), sim.num_devices,
                memory_bytes, sim.bytes_per_element, sim.tables.name, estimate, provenance, optimizer=sim.optimizer,
                data_parallel_tables=list(sim.data_parallel_tables), topology=sim.topology,
                comm_precision=sim.comm_precision)
    return plan.validate()


#: the neuroshard search's states that split tables of its own (``details['local_search_from']``)
SEARCH_SPLIT_STATES = ("beam-split", "heavy-split", "half-heavy-split")


def split_reasons(sim: Simulator, placement: Placement, memory_bytes: Any, algorithm: str) -> dict[str, str]:
    """Why each table ``placement`` splits was split, by table name (one of ``plan.SPLIT_REASONS``):
    ``memory`` when the table is larger than a device (split before any search,
    ``Simulator.memory_split``) or its pieces fit the devices no other way (the greedy baselines'
    extra splits, and a search's where it kept no split of its own); ``constraints`` when the
    tables file's constraints ask for the layout; for the splits a search chose (the neuroshard
    search's kept split states, bayes' trials, TorchRec's planner) ``balance`` when the table
    alone costs more than ``HALF_HEAVY_SHARE`` of the balanced bound (a device's even share; the
    neuroshard search's heavy-split threshold), else ``cost`` (the cost models estimated the plan
    cheaper with it split)."""
    counts: dict[int, int] = {}
    for piece in placement.pieces:
        counts[piece.table] = counts.get(piece.table, 0) + 1
    if not any(n > 1 for n in counts.values()):
        return {}
    details = placement.details or {}
    params = details.get("parameters") or {}
    start = sim.memory_split(memory_bytes, bool(params.get("row_splits", True)))
    started: dict[int, int] = {}
    for piece in start:
        started[piece.table] = started.get(piece.table, 0) + 1
    tables = whole_pieces(sim.tables)
    whole = sim.sizes_bytes(tables)
    largest = float(np.max(sim.memory_limits(memory_bytes)))
    large = bool(params.get("large_task")) and len(start) * sim.num_devices >= params["large_task"]
    searched = algorithm not in GREEDY_KEYS and algorithm != "measured-greedy" and "fallback" not in details
    if algorithm == "neuroshard":  # its unsplit states' extra splits only pack (large tasks split up front)
        searched = searched and (large or details.get("local_search_from") in SEARCH_SPLIT_STATES)
    heavy = sim.single_costs_ms(tables) > HALF_HEAVY_SHARE * sim.balanced_bound_ms()
    reasons = {}
    for table, n in sorted(counts.items()):
        if n > 1:
            reasons[sim.tables[table].name] = (
                "memory" if whole[table] > largest else "constraints" if started.get(table, 1) > 1 else
                "memory" if not searched else "balance" if heavy[table] else "cost")
    return reasons


@dataclass(frozen=True)
class Task:
    """A checked sharding task: everything ``search_plan`` needs but the cost models."""

    tables: TableSet
    devices: int
    memory: Any                 # as given (``Plan.memory_bytes`` records its resolved form)
    memory_bytes: Any           # one size, or per device from the topology
    limits: Any                 # what the placers compare with (per device when the topology says so)
    algorithm: str
    bytes_per_element: int
    seed: int
    optimizer: str
    data_parallel: str
    topology: Any
    comm_precision: str
    params: dict
    forced: list[str]           # tables allowed only data_parallel (never pieces)
    tier_costs: Any = None      # a measured miss path (``TierMeasurement``) the tiers are costed with; None: analytic
    objective: str = "embedding"  # what the plans are ranked by: ``OBJECTIVES``
    model: Any = None           # the dense part (``ModelSpec``) the iteration objective prices; None: the default DLRM
    operator_costs: Any = None  # operator cost models of the iteration objective (``OperatorModels`` or a path); None: shipped
    row_blocks: str = DEFAULT_ROW_BLOCKS  # which row splits the search may make (``constants.ROW_BLOCKS``)

    @property
    def replicating(self) -> bool:
        """Whether the search may replicate tables (``data_parallel="auto"`` and an algorithm that can)."""
        return _replicating(self.data_parallel, self.algorithm)

    @property
    def options(self) -> dict:
        """The keyword options that describe this task's plan (what ``search_plan`` takes besides the
        positional ones), e.g. to search the same task again with other models."""
        return dict(optimizer=self.optimizer, data_parallel=self.data_parallel, topology=self.topology,
                    comm_precision=self.comm_precision, **self.params,
                    **({} if self.row_blocks == DEFAULT_ROW_BLOCKS else {"row_blocks": self.row_blocks}),
                    **({} if self.tier_costs is None else {"tier_costs": self.tier_costs}),
                    **({} if self.objective == "embedding" else {"objective": self.objective, "model": self.model,
                                                                "operator_costs": self.operator_costs}))


def _replicating(data_parallel: str, algorithm: str) -> bool:
    return data_parallel == "auto" and get_trait(algorithm, "replicates")


def check_tier_costs(tier_costs: Any) -> Any:
    """``tier_costs`` as the search takes it: None for the analytic model (``"analytic"``, or
    None), else a ``TierMeasurement`` (one, or its dict). ``"measured"`` is refused here: the
    search times nothing, its caller measures (``neuroshard.shard``, ``search --tier-costs``)."""
    if tier_costs is None or tier_costs == "analytic":
        return None
    if tier_costs == "measured":
        raise NeuroShardError("tier_costs='measured' times this machine, which the search does not do: call "
                              "neuroshard.shard (it measures first), or pass the record of "
                              "neuroshard.costmodels.samples.tiers.measure_tier_costs()")
    if isinstance(tier_costs, str):
        raise NeuroShardError(f"tier_costs must be 'analytic' or 'measured', got {tier_costs!r}"[:200])
    return as_measurement(tier_costs)


def check_task(tables: TableSet | list[Table], devices: int, memory: int | str | list | None,
               algorithm: str = "neuroshard", bytes_per_element: int = FP32_BYTES, seed: int = 0, *,
               optimizer: str = DEFAULT_OPTIMIZER, data_parallel: str = DEFAULT_DATA_PARALLEL, topology: Any = None,
               comm_precision: str = "fp32", tier_costs: Any = None, objective: str = "embedding", model: Any = None,
               operator_costs: Any = None, row_blocks: str = DEFAULT_ROW_BLOCKS, **params: Any) -> Task:
    """Every argument of ``search_plan`` checked, and the task refused (one line) when no plan can
    exist, before any work: the measured loop calls this before minutes of timing."""
    tables = as_table_set(tables)
    devices = check_devices(devices)
    bytes_per_element = check_bytes_per_element(bytes_per_element)
    seed = check_seed(seed)
    optimizer = check_optimizer(optimizer)
    data_parallel = check_data_parallel(data_parallel)
    comm_precision = check_comm_precision(comm_precision)
    tier_costs = check_tier_costs(tier_costs)
    row_blocks = check_row_blocks(row_blocks)
    if objective not in OBJECTIVES:
        raise NeuroShardError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}"[:200])
    if objective == "iteration":  # a bad model or operator-costs file fails before any work
        model = _model_spec(model)
        operator_costs = operator_costs if isinstance(operator_costs, OperatorModels) else \
            load_operator_models(operator_costs)
    get_algorithm(algorithm)  # an unknown name fails before any work
    forced = forced_tables(tables)
    if forced and not _replicating(data_parallel, algorithm):
        raise NeuroShardError(f"table '{forced[0]}' allows only data_parallel sharding (its constraints): search "
                              f"with data_parallel='auto' (--data-parallel auto) and algorithm "
                              f"{' or '.join(REPLICATING_ALGORITHMS)}")
    topology, memory_bytes = resolve_topology(topology, devices, memory)
    limits = device_memory(topology, memory_bytes)  # per device when the topology says so
    row_splits = params.get("row_splits", True)
    if not isinstance(row_splits, bool):
        raise NeuroShardError(f"parameter row_splits must be true or false, got {row_splits!r}")
    if topology is None or (topology.host_memory_bytes is None and topology.ssd_bytes is None):
        check_capacity(tables, devices, limits, bytes_per_element, row_splits, optimizer)
    # else: tables may keep their rows in host memory or on SSD: ``search.tiers`` checks what fits
    check_constraints_feasible(tables, devices, limits, lambda cols: row_bytes(cols, bytes_per_element, optimizer),
                               ranks_per_host(topology, devices), row_splits)  # per-table constraints: one line naming the table
    if len(tables) * devices >= LARGE_TASK:  # say so before minutes without output
        log.info("a large task (%d tables on %d devices): the neuroshard search splits the heaviest tables up "
                 "front instead of its beam (parameter large_task); other algorithms as usual", len(tables), devices)
    return Task(tables, devices, memory, memory_bytes, limits, algorithm, bytes_per_element, seed, optimizer,
                data_parallel, topology, comm_precision, dict(params), forced, tier_costs, objective, model,
                operator_costs, row_blocks)


def _model_spec(model: Any) -> ModelSpec:
    """``model`` as a ``ModelSpec``: one, a model file's path or its dict, or None (the default DLRM)."""
    if model is None or isinstance(model, ModelSpec):
        return model or DEFAULT_MODEL
    if isinstance(model, (str, Path)):
        return ModelSpec.read(model)
    return ModelSpec.from_dict(model)


def search_task(task: Task, models: CostModels) -> Plan:
    """The plan ``task.algorithm`` finds for a checked task against ``models``."""
    sim = Simulator(task.tables, task.devices, models, task.bytes_per_element, optimizer=task.optimizer,
                    topology=task.topology, comm_precision=task.comm_precision, row_blocks=task.row_blocks)
    if sim.cost_precision != precision_of(task.bytes_per_element):
        log.warning("bytes_per_element=%d sizes the shards in memory, but no measured ratio carries the cost "
                    "models' %s kernels to %s: the cost estimates (and the search's choices) are for %s",
                    task.bytes_per_element, sim.cost_precision, precision_of(task.bytes_per_element),
                    sim.cost_precision)
    if task.forced:  # tables allowed only data_parallel are never pieces
        sim = sim.with_data_parallel(task.forced)
    if task.tier_costs is not None:  # the tiers costed with the miss path measured by the caller
        sim = sim.with_tier_costs(task.tier_costs)
    tiers, record = choose_tiers(sim, task.limits)  # None: every table fits in device memory
    if tiers is not None:
        sim = sim.with_tiers(tiers, record)
    sim.memory_split(task.memory_bytes, task.params.get("row_splits", True))  # once: every algorithm starts here
    start = time.perf_counter()
    if task.replicating:
        sim, placement = search_with_replication(
            sim, task.limits, lambda s, room: search_placement(s, room, task.algorithm, task.seed, **task.params))
    else:
        placement = search_placement(sim, task.limits, task.algorithm, task.seed, **task.params)
    elapsed = time.perf_counter() - start
    log.info("%s: %d shards, simulated %.4f ms, %.2f s", task.algorithm, len(placement.pieces), placement.cost_ms,
             elapsed)
    plan = make_plan(sim, placement, task.memory_bytes, task.algorithm, elapsed)
    return plan if task.objective == "embedding" else _fastest_iteration(task, sim, models, plan)


def _fastest_iteration(task: Task, sim: Simulator, models: CostModels, plan: Plan) -> Plan:
    """``objective="iteration"``: the plan of ``task.algorithm`` and the greedy baselines'
    (but random), each priced by the iteration-time model (``search.iteration``) for the task's
    dense model, and the fastest written, its provenance listing every candidate's predicted
    iteration. The baselines are searched on the same simulator (tiers and replicas as chosen).
    Candidates predicted within ``ITERATION_TIE_MARGIN`` of the chosen plan's step are listed as
    its ties: the model does not tell which of them trains faster."""
    candidates = {task.algorithm: plan}
    for name in with_trait("greedy_baseline"):
        if name in candidates or name == "random":
            continue
        start = time.perf_counter()
        placement = search_placement(sim, task.limits, name, task.seed)
        candidates[name] = make_plan(sim, placement, task.memory_bytes, name, time.perf_counter() - start)
    predicted = {name: estimate_iteration(p, task.tables, models, task.operator_costs, task.model)
                 for name, p in candidates.items()}
    chosen = min(predicted, key=lambda name: (predicted[name].iteration_ms, name != task.algorithm))
    fastest = predicted[chosen].iteration_ms
    ties = [name for name, e in predicted.items()
            if name != chosen and e.iteration_ms <= fastest * (1 + ITERATION_TIE_MARGIN)]
    best = candidates[chosen]
    best.estimate = {**(best.estimate or {}), "iteration_ms": round(fastest, 6)}
    best.provenance["objective"] = {
        "name": "iteration", "model": task.model.to_dict(), "chosen": chosen,
        "operators": task.operator_costs.hardware_.get("cpu_model", "unknown hardware"),
        "predicted_iteration_ms": {name: round(e.iteration_ms, 6) for name, e in predicted.items()},
        "tie_margin": ITERATION_TIE_MARGIN, "ties": ties}
    return best


def search_plan(tables: TableSet | list[Table], devices: int, memory: int | str | list | None,
                algorithm: str = "neuroshard", cost_models: Any = None, bytes_per_element: int = FP32_BYTES,
                seed: int = 0, **options: Any) -> Plan:
    """Search a sharding plan for ``tables`` over ``devices`` devices of ``memory`` each
    (bytes, or a size like ``"16GiB"``) with ``algorithm`` (one of ``ALGORITHMS``),
    against ``cost_models`` (a ``CostModels``, a checkpoint path, or None for the
    shipped one), with no timing of hardware. The plan is validated and carries
    ``estimate`` and ``provenance``. Raises InfeasibleError when the tables cannot fit.
    ``options``: ``optimizer`` (``optimizers.OPTIMIZERS``) counts its state in every shard's
    memory; ``data_parallel="auto"`` lets an algorithm with the ``replicates`` trait
    replicate small hot tables on every device when the simulator finds that cheaper
    (``replicate``), ``"never"`` (the default) shards every table; ``topology`` (a
    ``Topology``, a ``neuroshard.topology/v1`` file or its object) states hosts, links,
    per-device memory and speed, and ``memory`` may list one size per device;
    ``comm_precision`` (fp32, fp16, bf16) is what the all-to-all sends; ``tier_costs``
    (``"analytic"``, the default, or a ``TierMeasurement`` of this machine's miss path) costs
    the traffic of tables kept in host memory or on SSD; every other option goes to the
    algorithm (e.g. ``beam_width=4``). ``bytes_per_element`` 2 means fp16
    weights, costed at fp16 (``costmodels.precision``). ``neuroshard.shard`` adds the
    measured loop (``calibrate``, ``refine``: ``neuroshard.measured.api``)."""
    task = check_task(tables, devices, memory, algorithm, bytes_per_element, seed, **options)
    return search_task(task, resolve_cost_models(cost_models))
