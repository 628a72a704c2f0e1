"""``neuroshard.shard``: search, with the measured loop when asked (calibration, refine rounds).

``search.api.search_plan`` searches against the cost models alone; ``measured_search`` first checks the
task the same way (``search.api.check_task``: a bad argument or an impossible task fails
before minutes of timing), then calibrates the models on this machine and these tables
(``calibrate=SETS``) or runs refine rounds (``refine=ROUNDS``), then searches.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from ..constants import (
    FP32_BYTES,
    GPU_LIKE_MEMORY_BYTES,
    MAX_CALIBRATION_SETS,
    MIN_CALIBRATION_SETS,
    WEIGHTS_PRECISIONS,
    precision_of,
)
from ..costmodels import resolve_cost_models
from ..costmodels.ensemble import work_cost_models
from ..costmodels.samples.store import pretrained_here
from ..costmodels.samples.tiers import measure_tier_costs
from ..costmodels.samples.timing import time_devices
from ..errors import NeuroShardError
from ..plan import Plan
from ..search.api import Task, check_task, search_plan, search_task
from ..tables import Table, TableSet
from ..types import DeviceTimer
from .budget import Budget, stop_reason
from .calibrate import DEFAULT_SETS, Calibration, calibrated_models, start_calibration
from .candidates import COMPARE, PRETRAINED_SUFFIX
from .choice import measured_choice
from .judge import PlanJudge
from .refine import expect_stages
from .refine import refine as refine_rounds
from .rounds import check_refine

log = logging.getLogger(__name__)
_warned: set = set()  # the cost models already warned about in this process


def device_kind_mismatch(models: Any, task: Task) -> str | None:
    """Why the task's devices look like GPUs while the models' data was measured on a CPU
    (None when they do not): GPU-sized memory per device, or hosts and links stated. Models
    pre-trained on this very machine (``pretrain --here``) describe the machine the plan is for."""
    machine = (models.hardware or {}).get("hardware") or {}
    if not machine.get("cpu_model") or machine.get("gpu") or pretrained_here(models.hardware):
        return None
    smallest = float(np.min(task.memory_bytes))
    if smallest >= GPU_LIKE_MEMORY_BYTES:
        return f"devices of {smallest / 2**30:.0f} GiB"
    if task.topology is not None and task.topology.hosts_stated:
        return "hosts and links of a GPU cluster"
    if (task.topology is not None and (task.topology.host_memory_bytes or task.topology.ssd_bytes)
            and task.tier_costs is None):  # measured tier costs: the plan is for this machine's CPUs
        return "host memory or SSD tiers of a GPU server"
    return None


def warn_device_kind(models: Any, task: Task) -> None:
    """Warn once per process and cost model when ``device_kind_mismatch``."""
    why = device_kind_mismatch(models, task)
    if why and models.name not in _warned:
        _warned.add(models.name)
        log.warning("planning %s with cost model '%s', measured on %s: its estimates describe that CPU, not "
                    "GPUs. Calibrate on the machine you will train on (--calibrate), or pre-train for your "
                    "GPUs (docs/guide.md, 'Pre-training for your own hardware')", why, models.name,
                    models.describe_hardware())


def check_calibrate(calibrate: Any) -> int:
    """``calibrate`` as a number of random sets (0: no calibration); one-line error otherwise.
    One type everywhere: ``neuroshard.shard(calibrate=200)``, ``search --calibrate 200``, ``demo --calibrate 200``."""
    if (isinstance(calibrate, bool) or not isinstance(calibrate, int)
            or (calibrate != 0 and not MIN_CALIBRATION_SETS <= calibrate <= MAX_CALIBRATION_SETS)):
        raise NeuroShardError(f"calibrate must be a number of random sets in [{MIN_CALIBRATION_SETS}, "
                              f"{MAX_CALIBRATION_SETS}] (e.g. {DEFAULT_SETS}), or 0 for none, got {calibrate!r}")
    return calibrate


def calibration_options(task: Task, sets: int) -> dict:
    """``calibrated_models``' options for ``task``: ``sets`` random sets, timed at the plan's
    weights precision where a kernel trains it."""
    precision = precision_of(task.bytes_per_element)
    return {"sets": sets, **({"weights_precision": precision}
                             if precision in WEIGHTS_PRECISIONS and precision != "fp32" else {})}


def with_measured_tier_costs(task: Task) -> Task:
    """``task`` with the miss path measured on this machine (``measure_tier_costs``, a few
    seconds) to cost its tiers with; unchanged when its topology states no host memory or SSD
    (no table can leave the devices)."""
    topology = task.topology
    if topology is None or (topology.host_memory_bytes is None and topology.ssd_bytes is None):
        log.info("tier_costs='measured': the topology states no host memory or SSD, nothing to measure")
        return task
    return dataclasses.replace(task, tier_costs=measure_tier_costs())


def calibrated_search(task: Task, models: Any, calibrated: Any, timer: DeviceTimer = time_devices) -> Plan:
    """The plan of ``task`` searched against the ``calibrated`` models, unless the same search
    against the pre-trained ``models``, or against the calibration's work model alone
    (``costmodels.ensemble.work_cost_models``, when it has one), gives a plan that measures
    cheaper here: when the plans differ, they are timed together (``choice.measured_choice``:
    every device, twice, ``measure``'s protocol, a tie to the calibrated plan) and the cheapest
    is written. A model calibrated on a few hundred random sets can be wrong where the search
    goes: on dlrm-2021 (96 tables, 8 devices, seed 153) the calibrated search split tables into
    135 shards for 96 and measured 1.50x the best baseline, the pre-trained one's plan 1.22x
    (docs/decisions.md#refine-loop). The plan's provenance records the check
    (``calibration_check``); ``timer``: the device timer (``types.DeviceTimer``; tests pass a fake)."""
    plan = search_task(task, calibrated)
    named = [("calibrated", plan), ("pre-trained", search_task(task, models))]
    work = work_cost_models(calibrated)
    if work is not None:  # the calibration's work model alone (costmodels.ensemble): a plan not steered by the members
        named.append(("work-model", search_task(task, work)))
    distinct: dict = {}
    for name, candidate in named:
        distinct.setdefault(candidate.layout_key(), (name, candidate))
    same = {name for name, _ in named} - {name for name, _ in distinct.values()}  # one of the plans before them
    named = list(distinct.values())
    if len(named) == 1:
        plan.provenance["calibration_check"] = {"pretrained_plan": "the same", **({"work_plan": "the same"}
                                                                                  if work is not None else {})}
        return plan
    options = {k: v for k, v in calibration_options(task, 0).items() if k != "sets"}
    timing = Calibration(task.tables, models, task.seed, timer=timer, **options)  # its timer; nothing is fitted
    try:
        best, costs, _ = measured_choice(named, task.tables, timing, calibrated)
    except NeuroShardError as exc:
        log.warning("calibrate: the calibrated, pre-trained and work models' plans could not be timed; writing the "
                    "calibrated one: %s", exc)
        plan.provenance["calibration_check"] = {"stopped": str(exc).splitlines()[0]}
        return plan
    record = {"measured_cost_ms": {name: round(c, 4) for (name, _), c in zip(named, costs)},
              "written": named[best][0]}
    if "pre-trained" in same:
        record["pretrained_plan"] = "the same"
    if "work-model" in same:
        record["work_plan"] = "the same"
    log.info("calibrate: plans timed together: %s; writing the %s plan",
             ", ".join(f"{name} {c:.2f} ms" for (name, _), c in zip(named, costs)),
             named[best][0])
    chosen = named[best][1]
    chosen.provenance["calibration_check"] = record
    return chosen


def refine_task(task: Task, memory: Any, models: Any, rounds: int, sets: int, budget: Budget,
                calibration: Calibration | None = None, judge: PlanJudge | None = None) -> Plan:
    """``measured_search``'s measured loop within ``budget``: the plain search's plan first (seconds, nothing
    timed: what is written if nothing else fits or the loop is stopped), then calibration with
    ``sets`` random sets (unless ``calibration`` is given), then refine's ``rounds`` and stages.
    The plan's ``search_time_s`` is the whole wall time of the loop."""
    algorithm = task.algorithm
    options = {"bytes_per_element": task.bytes_per_element, "seed": task.seed, **task.options}
    expect_stages(budget, len(task.tables), task.devices, rounds, COMPARE)
    with budget.stage("search"):
        fallback = search_plan(task.tables, task.devices, memory, algorithm=algorithm, cost_models=models, **options)
    budget.keep(fallback, f"{algorithm}{PRETRAINED_SUFFIX}")
    try:
        if calibration is None:
            calibration = start_calibration(task.tables, models, devices=task.devices, seed=task.seed, budget=budget,
                                            **calibration_options(task, sets))
    except KeyboardInterrupt as exc:  # stopped while calibrating: the plain search's plan is written
        budget.stop(stop_reason(exc))
        budget.progress.close()
        fallback.provenance["refine"] = {"rounds": [], "chosen_round": None, "chosen": budget.best_name,
                                         "compared": [], **budget.record()}
        fallback.provenance["search_time_s"] = round(budget.elapsed(), 4)
        return fallback
    plan = refine_rounds(task.tables, task.devices, memory, calibration, rounds, algorithm=algorithm, judge=judge,
                         budget=budget, fallback=fallback, **options)
    plan.provenance["search_time_s"] = round(budget.elapsed(), 4)
    return plan


def measured_search(tables: TableSet | list[Table], devices: int, memory: int | str | list | None,
                    algorithm: str = "neuroshard", cost_models: Any = None, bytes_per_element: int = FP32_BYTES,
                    seed: int = 0, calibrate: int = 0, *, refine: int = 0, tier_costs: Any = "analytic",
                    calibration: Calibration | None = None, judge: PlanJudge | None = None, budget_s: Any = None,
                    progress: str = "auto", **options: Any) -> Plan:
    """Search a sharding plan (``search.api.search_plan``: its arguments and ``options``), with
    the measured loop when asked: ``calibrate=SETS`` (e.g. 200) first calibrates the cost
    models on this machine and these tables with that many random sets
    (``calibrate.calibrated_models``, cached per machine and task) and writes the plan of
    the calibrated models unless the pre-trained models' plan measures cheaper here
    (``calibrated_search``); ``refine=N`` runs N refine
    rounds (``refine``; calibrating afresh with ``calibrate`` sets, ``DEFAULT_SETS`` when 0):
    each round's plan is timed on this machine, the models fine-tuned on its devices, and the
    plan measured cheapest, polished, is returned. ``tier_costs="measured"`` costs the tables
    kept in host memory or on SSD with their miss path timed on this machine first (for plans
    the included runtime trains on these CPUs; ``"analytic"``, the default, models GPU servers'
    links), or takes such a record (``costmodels.samples.tiers.TierMeasurement``).
    ``calibration`` (with ``refine`` only): a ``Calibration`` of these tables whose sets are
    already timed (``start_calibration``), refined on instead of timing ``calibrate`` sets
    afresh (the demo calibrates once for its baselines and its refine rounds). ``judge`` (with
    ``refine`` only): a ``measured.judge.PlanJudge`` that makes refine's final choice, e.g.
    ``runtime.judge.RuntimeJudge()`` (the plans trained on the included runtime).

    ``budget_s`` (with ``refine`` only): the measured loop's wall clock, calibration included
    (seconds, or ``"5m"``-style, ``measured.budget.parse_budget``; None: ``RefineConfig``'s default,
    300 s up to 8 devices and in proportion above; ``math.inf``: unbounded), or a ``Budget`` already
    started (the demo starts one before its calibration). ``progress``: what the loop says while it
    runs (``measured.progress.Progress``'s modes: ``"auto"``, ``"bar"``, ``"lines"``, ``"quiet"``).
    The plan's ``provenance.search_time_s`` is then the loop's whole wall time, and
    ``provenance.refine`` records the budget (``measured.refine.refine``)."""
    sets = check_calibrate(calibrate)
    if not refine and budget_s is not None:
        raise NeuroShardError("budget_s= bounds the measured loop: it needs refine=N")
    if judge is not None and (not refine or not isinstance(judge, PlanJudge)):
        raise NeuroShardError("judge= takes a PlanJudge (e.g. neuroshard.runtime.judge.RuntimeJudge()), and only with "
                              "refine" if refine else "judge= makes refine's final choice: it needs refine=N")
    if calibration is not None and (not refine or not isinstance(calibration, Calibration)):
        raise NeuroShardError("calibration= takes a started Calibration (start_calibration), and only with refine"
                              if refine else "calibration= is for refine rounds (refine=N); calibrate=SETS "
                                             "calibrates a plain search")
    measure = tier_costs == "measured"
    task = check_task(tables, devices, memory, algorithm, bytes_per_element, seed,
                      tier_costs=None if measure else tier_costs, **options)
    if measure:  # after every check: a bad argument fails before any timing
        task = with_measured_tier_costs(task)
    models = resolve_cost_models(cost_models)
    if refine:
        budget = budget_s if isinstance(budget_s, Budget) else Budget.for_task(task.devices, budget_s, progress)
        return refine_task(task, memory, models, check_refine(algorithm, refine), sets or DEFAULT_SETS, budget,
                           calibration, judge)
    warn_device_kind(models, task)
    if sets:
        return calibrated_search(task, models, calibrated_models(task.tables, models, devices=task.devices,
                                                                 **calibration_options(task, sets)))
    return search_task(task, models)
