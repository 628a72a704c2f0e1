"""``shard(tables, devices=, memory=)`` -> a validated ``Plan``: the one call most users need."""
from __future__ import annotations

import datetime as _dt
import logging
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import InfeasibleError, NeuroShardError
from ..plan import Plan
from ..tables import Table, TableSet
from ..validate import (MAX_LOOKUPS_PER_BATCH, MAX_TABLES, check_batch_size, check_bytes_per_element, check_devices,
                        check_int, check_memory, check_seed)
from .rowwise import check_feasible, runnable_row_splits
from .simulator import Placement, Simulator

log = logging.getLogger(__name__)

GREEDY_ALGORITHMS = ("random", "size", "dim", "lookup", "size-lookup")
ALGORITHMS = ("neuroshard", *GREEDY_ALGORITHMS, "measured-greedy", "bayes", "torchrec")


def _params(cls: type, params: dict, algorithm: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise NeuroShardError(f"unknown parameter(s) {', '.join(unknown)} for algorithm '{algorithm}' "
                              f"(known: {', '.join(sorted(known))})")
    return cls(**params)


def _no_params(params: dict, algorithm: str) -> None:
    if params:
        raise NeuroShardError(f"algorithm '{algorithm}' takes no parameters, got {', '.join(sorted(params))}")


def search_placement(sim: Simulator, memory_bytes: int, algorithm: str = "neuroshard", seed: int = 0,
                     **params: Any) -> Placement:
    """Run one algorithm on a simulator (the simulator's caches carry over between calls)."""
    if algorithm == "neuroshard":
        from .neuroshard import NeuroShardParams, search
        chosen = _params(NeuroShardParams, params, algorithm)
        try:
            return search(sim, memory_bytes, chosen)
        except InfeasibleError as exc:
            # Never worse at finding a valid plan than the baselines it ships: keep the best that packs.
            fallback = best_packing_greedy(sim, memory_bytes, seed)
            if fallback is None:
                raise
            log.warning("the NeuroShard search could not pack the shards (%s); using the %s baseline's plan",
                        exc, fallback.details["fallback"]["algorithm"])
            fallback.details["fallback"]["reason"] = str(exc)
            fallback.details["parameters"] = {**fallback.details.get("parameters", {}),
                                              "neuroshard": asdict(chosen)}
            return fallback
    if algorithm in GREEDY_ALGORITHMS:
        from .baselines import greedy_by_key
        _no_params(params, algorithm)
        return greedy_by_key(sim, memory_bytes, algorithm, seed)
    if algorithm == "measured-greedy":
        from .measured_greedy import MeasuredGreedyParams, search as measured_search
        return measured_search(sim, memory_bytes, _params(MeasuredGreedyParams, params, algorithm))
    if algorithm == "bayes":
        from .bayes import BayesParams, search as bayes_search
        return bayes_search(sim, memory_bytes, _params(BayesParams, params, algorithm), seed)
    if algorithm == "torchrec":
        from .torchrec_planner import search as torchrec_search
        unknown = sorted(set(params) - {"compute_device"})
        if unknown:
            raise NeuroShardError(f"unknown parameter(s) {', '.join(unknown)} for algorithm 'torchrec'")
        return torchrec_search(sim, memory_bytes, **params)
    raise NeuroShardError(f"unknown algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")


def best_packing_greedy(sim: Simulator, memory_bytes: int, seed: int = 0) -> Placement | None:
    """The simulated cheapest of the shipped greedy baselines that packs the tables into
    memory (None when none does); ``details['fallback']`` names it and what else was tried."""
    from .baselines import greedy_by_key
    best, tried = None, {}
    for key in GREEDY_ALGORITHMS:
        try:
            placed = greedy_by_key(sim, memory_bytes, key, seed)
        except InfeasibleError:
            tried[key] = "could not pack"
            continue
        tried[key] = round(placed.cost_ms, 6)
        if best is None or placed.cost_ms < best[1].cost_ms:
            best = (key, placed)
    if best is None:
        return None
    key, placed = best
    placed.details["fallback"] = {"algorithm": key, "baselines": tried}
    return placed


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
    pieces, devices = runnable_row_splits(
        placement.pieces, placement.devices, sim.num_devices, sim.bytes_per_element, memory_bytes,
        lambda pieces, devices: float(sim.evaluate(pieces, devices[None, :]).max_ms[0]))
    placement = Placement(pieces, devices, placement.cost_ms, placement.details)
    estimate = sim.evaluate(placement.pieces, placement.devices[None, :]).to_dict()
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
    if "fallback" in placement.details:  # the search could not pack: a baseline's plan, and why
        provenance["fallback"] = placement.details["fallback"]
    plan = Plan(list(sim.tables.tables), sim.to_shards(placement.pieces, placement.devices), sim.num_devices,
                memory_bytes, sim.bytes_per_element, sim.tables.name, estimate, provenance)
    return plan.validate()


def shard(tables: TableSet | list[Table], devices: int, memory: int | str, algorithm: str = "neuroshard",
          cost_models: Any = None, bytes_per_element: int = 4, seed: int = 0, calibrate: bool | int = False,
          **params: Any) -> Plan:
    """Search a sharding plan for ``tables`` over ``devices`` devices of ``memory`` each
    (bytes, or a size like ``"16GiB"``) with ``algorithm`` (one of ``ALGORITHMS``),
    against ``cost_models`` (a ``CostModels``, a checkpoint path, or None for the
    shipped one). ``params`` go to the algorithm (e.g. ``beam_width=4``). The plan is
    validated and carries ``estimate`` and ``provenance``. Raises InfeasibleError when
    the tables cannot fit. ``calibrate=True`` (or a number of random sets) first
    calibrates the cost models on this machine and these tables
    (``costmodels.calibrate.calibrated_models``, cached per machine and task)."""
    tables = as_table_set(tables)
    devices = check_devices(devices)
    bytes_per_element = check_bytes_per_element(bytes_per_element)
    seed = check_seed(seed)
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise NeuroShardError(f"unknown algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})")
    memory_bytes = check_memory(memory)
    row_splits = params.get("row_splits", True)
    if not isinstance(row_splits, bool):
        raise NeuroShardError(f"parameter row_splits must be true or false, got {row_splits!r}")
    check_feasible(tables, devices, memory_bytes, bytes_per_element, row_splits)
    models = resolve_cost_models(cost_models)
    if calibrate is not False:
        from ..costmodels.calibrate import DEFAULT_SETS, calibrated_models
        sets = DEFAULT_SETS if calibrate is True else check_int(calibrate, "calibrate (random sets)", 8, 100000)
        models = calibrated_models(tables, models, devices=devices, sets=sets)
    sim = Simulator(tables, devices, models, bytes_per_element)
    start = time.perf_counter()
    placement = search_placement(sim, memory_bytes, algorithm, seed, **params)
    elapsed = time.perf_counter() - start
    log.info("%s: %d shards, simulated %.4f ms, %.2f s", algorithm, len(placement.pieces), placement.cost_ms, elapsed)
    return make_plan(sim, placement, memory_bytes, algorithm, elapsed)
