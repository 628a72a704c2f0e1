"""``shard(tables, devices=, memory=)`` -> a validated ``Plan``: the one call most users need."""
from __future__ import annotations

import datetime as _dt
import logging
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import NeuroShardError
from ..constraints import check_feasible as check_constraints_feasible
from ..optimizers import DEFAULT_OPTIMIZER, check_optimizer, row_bytes
from ..plan import Plan
from ..tables import Table, TableSet
from ..topology import device_memory, resolve_topology
from ..kernels import WEIGHTS_PRECISIONS, precision_of
from ..validate import (MAX_LOOKUPS_PER_BATCH, MAX_TABLES, check_batch_size, check_bytes_per_element, check_comm_precision,
                        check_devices, check_int, check_memory, check_seed)
from .baselines import best_packing_greedy  # noqa: F401  (public here: the fuzz experiment uses it)
from .registry import ALGORITHMS, GREEDY_ALGORITHMS, get_algorithm, make_params  # noqa: F401
from .rowwise import check_feasible, local_ranks, runnable_row_splits
from .replicate import (DEFAULT_DATA_PARALLEL, REPLICATING_ALGORITHMS, check_data_parallel, forced_tables,
                        replicated_bytes, search_with_replication)
from .simulator import Placement, Simulator

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


def resolve_cost_models(cost_models: Any = None):
    """A ``CostModels`` bundle from a bundle, a checkpoint path, or None (the shipped default)."""
    from ..costmodels import CostModels, load_cost_models
    if isinstance(cost_models, CostModels):
        return cost_models
    if cost_models is None or isinstance(cost_models, (str, Path)):
        return load_cost_models(cost_models)
    raise NeuroShardError(f"cost_models must be a CostModels bundle or a checkpoint path, "
                          f"got {type(cost_models).__name__}")


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
    them (``rowwise.runnable_row_splits``: blocks in rank order, else re-cut or joined)."""
    room = sim.memory_limits(memory_bytes) - replicated_bytes(sim, sim.data_parallel_tables)  # what shards may use
    pieces, devices = runnable_row_splits(
        placement.pieces, placement.devices, sim.num_devices, sim.bytes_per_element, room,
        lambda pieces, devices: float(sim.evaluate(pieces, devices[None, :]).max_ms[0]), optimizer=sim.optimizer,
        local_world_size=sim.local_world_size, allowed=sim.allows_placement)
    placement = Placement(pieces, devices, placement.cost_ms, placement.details)
    estimate = sim.evaluate(placement.pieces, placement.devices[None, :], risk=0.0).to_dict()  # the mean
    estimate["batch_size"] = sim.tables.batch_size
    bound = sim.balanced_bound_ms()
    estimate["balanced_bound_ms"] = round(bound, 6)
    estimate["ratio_to_balanced_bound"] = round(estimate["max_device_cost_ms"] / bound, 4) if bound > 0 else None
    models = sim.cost_models
    provenance = {"algorithm": algorithm, "parameters": placement.details.get("parameters", {}),
                  "cost_model": models.name,
                  "cost_model_batch_size": models.batch_size,
                  "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  "search_time_s": round(search_time_s, 4)}
    if getattr(models, "path", None):
        provenance["cost_model_path"] = str(models.path)
    provenance["neuroshard_version"] = __version__
    if sim.risk:  # an ensemble: the search charged mean x exp(risk x spread) per device set
        provenance["risk"] = sim.risk
    if sim.bytes_per_element != 4 or sim.cost_precision != COST_PRECISION:  # what the estimate's compute is for
        provenance["cost_precision"] = sim.cost_precision
        provenance.update(sim.precision_provenance)
    if sim.optimizer != DEFAULT_OPTIMIZER:  # its state counts in memory; costs are the SGD-measured kernels'
        provenance["cost_optimizer"] = COST_OPTIMIZER
    if sim.topology is not None:  # the cluster the plan is for (also in the plan's topology field)
        provenance["topology"] = sim.topology.describe()
    if "data_parallel" in placement.details:  # data_parallel="auto": what was replicated, and why
        provenance["data_parallel"] = placement.details["data_parallel"]
    if "fallback" in placement.details:  # the search could not pack: a baseline's plan, and why
        provenance["fallback"] = placement.details["fallback"]
    plan = Plan(list(sim.tables.tables), sim.to_shards(placement.pieces, placement.devices), sim.num_devices,
                memory_bytes, sim.bytes_per_element, sim.tables.name, estimate, provenance, optimizer=sim.optimizer,
                data_parallel_tables=list(sim.data_parallel_tables), topology=sim.topology,
                comm_precision=sim.comm_precision)
    return plan.validate()


def _calibration_options(calibrate: bool | int, bytes_per_element: int) -> dict:
    """``calibrated_models``' sets and weights precision for ``shard(calibrate=...)``."""
    from ..costmodels.calibrate import DEFAULT_SETS
    # True (and False, from shard(refine=) without calibrate) mean the default; 1 is a set count, and refused
    default = calibrate is True or calibrate is False
    sets = DEFAULT_SETS if default else check_int(calibrate, "calibrate (random sets)", 8, 100000)
    precision = precision_of(bytes_per_element)  # timed at the plan's precision where a kernel trains it
    return {"sets": sets, **({"weights_precision": precision}
                             if precision in WEIGHTS_PRECISIONS and precision != "fp32" else {})}


def _refined(tables: TableSet, devices: int, memory: Any, algorithm: str, models: Any, bytes_per_element: int,
             seed: int, calibrate: bool | int, rounds: Any, **options: Any) -> Plan:
    """``shard(refine=rounds)``: calibrate afresh (the measurements are the refinement's
    data, so no cache), then ``search.refine.refine``."""
    from ..costmodels.calibrate import start_calibration
    from .refine import check_refine, refine
    rounds = check_refine(algorithm, rounds)
    calibration = start_calibration(tables, models, devices=devices, seed=seed,
                                    **_calibration_options(calibrate, bytes_per_element))
    return refine(tables, devices, memory, calibration, rounds, algorithm=algorithm,
                  bytes_per_element=bytes_per_element, seed=seed, **options)


def shard(tables: TableSet | list[Table], devices: int, memory: int | str | list | None, algorithm: str = "neuroshard",
          cost_models: Any = None, bytes_per_element: int = 4, seed: int = 0, calibrate: bool | int = False,
          *, optimizer: str = DEFAULT_OPTIMIZER, data_parallel: str = DEFAULT_DATA_PARALLEL, topology: Any = None,
          comm_precision: str = "fp32", refine: int = 0, **params: Any) -> Plan:
    """Search a sharding plan for ``tables`` over ``devices`` devices of ``memory`` each
    (bytes, or a size like ``"16GiB"``) with ``algorithm`` (one of ``ALGORITHMS``),
    against ``cost_models`` (a ``CostModels``, a checkpoint path, or None for the
    shipped one). ``params`` go to the algorithm (e.g. ``beam_width=4``). The plan is
    validated and carries ``estimate`` and ``provenance``. Raises InfeasibleError when
    the tables cannot fit. ``calibrate=True`` (or a number of random sets) first
    calibrates the cost models on this machine and these tables
    (``costmodels.calibrate.calibrated_models``, cached per machine and task).
    ``optimizer`` (``optimizers.OPTIMIZERS``) counts its state in every shard's memory.
    ``data_parallel="auto"`` lets the NeuroShard search replicate small hot tables on every
    device when the simulator finds that cheaper (``replicate``); ``"never"`` (the default)
    shards every table.
    ``topology`` (a ``Topology``, a ``neuroshard.topology/v1`` file or its object) states hosts,
    links, per-device memory and speed; ``memory`` may list one size per device.
    ``bytes_per_element`` 2 means fp16 weights, costed at fp16 (``costmodels.precision``);
    ``comm_precision`` (fp32, fp16, bf16) is what the all-to-all sends: fp16/bf16 halve its bytes.
    ``refine=N`` (with calibration, ``calibrate=True`` when not given) then runs N rounds of
    measured refinement (``search.refine``): each round's plan is timed on this machine,
    the models fine-tuned on its devices, and the plan measured cheapest is returned."""
    tables = as_table_set(tables)
    devices = check_devices(devices)
    bytes_per_element = check_bytes_per_element(bytes_per_element)
    seed = check_seed(seed)
    optimizer = check_optimizer(optimizer)
    data_parallel = check_data_parallel(data_parallel)
    comm_precision = check_comm_precision(comm_precision)
    get_algorithm(algorithm)  # an unknown name fails before any work
    replicating = data_parallel == "auto" and algorithm in REPLICATING_ALGORITHMS
    forced = forced_tables(tables)
    if forced and not replicating:
        raise NeuroShardError(f"table '{forced[0]}' allows only data_parallel sharding (its constraints): search "
                              f"with data_parallel='auto' (--data-parallel auto) and algorithm "
                              f"{' or '.join(REPLICATING_ALGORITHMS)}")
    topology, memory_bytes = resolve_topology(topology, devices, memory)
    limits = device_memory(topology, memory_bytes)  # per device when the topology says so
    row_splits = params.get("row_splits", True)
    if not isinstance(row_splits, bool):
        raise NeuroShardError(f"parameter row_splits must be true or false, got {row_splits!r}")
    check_feasible(tables, devices, limits, bytes_per_element, row_splits, optimizer)
    local = topology.local_world_size if topology is not None and topology.hosts_stated else local_ranks(devices)
    check_constraints_feasible(tables, devices, limits, lambda cols: row_bytes(cols, bytes_per_element, optimizer),
                               local, row_splits)  # per-table constraints: one line naming the table
    if len(tables) * devices >= LARGE_TASK:  # say so before minutes without output
        log.warning("a large task (%d tables on %d devices): the %s search may take minutes", len(tables), devices,
                    algorithm)
    models = resolve_cost_models(cost_models)
    if refine:
        return _refined(tables, devices, memory, algorithm, models, bytes_per_element, seed, calibrate, refine,
                        optimizer=optimizer, data_parallel=data_parallel, topology=topology,
                        comm_precision=comm_precision, **params)
    if calibrate is not False:
        from ..costmodels.calibrate import calibrated_models
        options = _calibration_options(calibrate, bytes_per_element)
        models = calibrated_models(tables, models, devices=devices, **options)
    sim = Simulator(tables, devices, models, bytes_per_element, optimizer=optimizer, topology=topology,
                    comm_precision=comm_precision)
    if sim.cost_precision != precision_of(bytes_per_element):
        log.warning("bytes_per_element=%d sizes the shards in memory, but no measured ratio carries the cost "
                    "models' %s kernels to %s: the cost estimates (and the search's choices) are for %s",
                    bytes_per_element, sim.cost_precision, precision_of(bytes_per_element), sim.cost_precision)
    if forced:  # tables allowed only data_parallel are never pieces
        sim = sim.with_data_parallel(forced)
    sim.memory_split(memory_bytes, row_splits)  # once, before any algorithm: every one starts from these pieces
    start = time.perf_counter()
    if replicating:
        sim, placement = search_with_replication(
            sim, limits, lambda s, room: search_placement(s, room, algorithm, seed, **params))
    else:
        placement = search_placement(sim, limits, algorithm, seed, **params)
    elapsed = time.perf_counter() - start
    log.info("%s: %d shards, simulated %.4f ms, %.2f s", algorithm, len(placement.pieces), placement.cost_ms, elapsed)
    return make_plan(sim, placement, memory_bytes, algorithm, elapsed)
