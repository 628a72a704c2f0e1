"""Measure plans device by device on one machine: ``neuroshard measure``.

A device's embedding compute does not depend on the other devices, so every device of
a plan of any device count is timed one after another (``costmodels.samples.timing``,
the device timer: each device's shards as one fused kernel, the devices of all plans
taking turns round-robin in one interleaved run), and a plan's compute cost is its
slowest device. Lookups are each table's batch (``datasets.sampler.sample_lookups``),
the same for every plan, cut to each shard's rows as the training runtime cuts them.
Communication cannot be timed one device at a time: it is the comm models' prediction
for the measured compute, labelled as modeled.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..constants import trained_precision
from ..costmodels import resolve_cost_models
from ..costmodels.metrics import gmae
from ..costmodels.samples.timing import device_figures, time_devices
from ..errors import InvalidPlanError, NeuroShardError
from ..io import atomic_write_text
from ..plan import Plan
from ..search.simulator import Simulator
from ..tables import TableSet

log = logging.getLogger(__name__)

def estimate_gmae(estimated: Sequence[float], measured: Sequence[float]) -> float:
    """Geometric mean of |estimate - measured| / measured over the devices with shards."""
    keep = [i for i, c in enumerate(measured) if c > 0]
    return gmae(np.asarray(estimated)[keep], np.asarray(measured)[keep])


def estimate_spearman(estimated: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman rank correlation of estimated and measured compute over a plan's devices."""
    estimated, measured = [float(x) for x in estimated], [float(x) for x in measured]
    if len(measured) < 3 or len(set(measured)) < 2 or len(set(estimated)) < 2:
        return float("nan")
    from scipy.stats import spearmanr
    return float(spearmanr(estimated, measured).statistic)


@dataclass
class PlanMeasurement:
    """Measured compute per device of one plan, beside the cost models' estimate."""

    name: str
    plan: Plan
    compute_ms: list[float]             # measured (timing.device_time of the run's figure), per device
    passes_ms: list[list[float]]        # per device, per measured pass
    estimated_compute_ms: list[float]   # the compute model's estimate, per device
    modeled_comm_ms: list[float]        # comm models (fwd incl. waiting + bwd + reduce) for the measured compute
    estimated_total_ms: list[float]     # the simulator's total, per device

    @property
    def max_compute_ms(self) -> float:
        return max(self.compute_ms)

    @property
    def balance(self) -> float:
        """max / mean of the measured compute over devices (1.0 is perfectly balanced)."""
        mean = float(np.mean(self.compute_ms))
        return self.max_compute_ms / mean if mean > 0 else float("nan")

    @property
    def max_total_ms(self) -> float:
        """The slowest device of measured compute plus modeled communication."""
        return max(c + m for c, m in zip(self.compute_ms, self.modeled_comm_ms))

    @property
    def error_gmae(self) -> float:
        return estimate_gmae(self.estimated_compute_ms, self.compute_ms)

    @property
    def error_spearman(self) -> float:
        return estimate_spearman(self.estimated_compute_ms, self.compute_ms)

    def per_device_table(self):
        """One row per device (pandas): shards, width, measured and estimated compute, modeled comm."""
        import pandas as pd
        rows = []
        for d in range(self.plan.num_devices):
            shards = self.plan.shards_on(d)
            measured, est = self.compute_ms[d], self.estimated_compute_ms[d]
            rows.append({"device": d, "shards": len(shards), "width": sum(s.num_cols for s in shards),
                         "compute_ms": measured, "estimate_ms": est,
                         "error_%": 100.0 * (est - measured) / measured if measured > 0 else float("nan"),
                         "spread_%": 100.0 * (max(self.passes_ms[d]) - min(self.passes_ms[d])) / measured
                         if measured > 0 else float("nan"),
                         "comm_ms (modeled)": self.modeled_comm_ms[d]})
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        return {"plan": self.name, "devices": self.plan.num_devices, "shards": len(self.plan.shards),
                "max_compute_ms": self.max_compute_ms, "balance": self.balance,
                "estimated_max_compute_ms": max(self.estimated_compute_ms),
                "max_total_ms (measured compute + modeled comm)": self.max_total_ms,
                "estimate_gmae": self.error_gmae, "estimate_spearman": self.error_spearman}

    def to_dict(self) -> dict:
        return {**self.summary(), "compute_ms": self.compute_ms, "passes_ms": self.passes_ms,
                "estimated_compute_ms": self.estimated_compute_ms, "modeled_comm_ms": self.modeled_comm_ms,
                "estimated_total_ms": self.estimated_total_ms,
                "algorithm": (self.plan.provenance or {}).get("algorithm")}


@dataclass
class MeasureResult:
    """Every plan of one interleaved ``measure`` run, and how it was run."""

    plans: list[PlanMeasurement]
    config: dict

    def __getitem__(self, name: str) -> PlanMeasurement:
        for p in self.plans:
            if p.name == name:
                return p
        raise KeyError(name)

    def ratios(self) -> list[float]:
        """Each plan's measured max-device compute over the first plan's."""
        first = self.plans[0].max_compute_ms
        return [p.max_compute_ms / first for p in self.plans]

    def format(self) -> str:
        import pandas as pd
        c = self.config
        lines = [f"measured on {c['backend']} ({c['hardware']}), kernel {c['kernel']}, {c['clock']} clock, "
                 f"batch {c['batch_size']}, {_figure_words(c)} of {c['passes']} passes after {c['warmup_passes']} warm-up "
                 f"({c['repeats']} runs per device and round, each after a cache flush); rows capped at {c['row_cap']:,} "
                 f"({c['capped_shards']} shards capped); weights buffer {c['buffer_bytes'] / 2**20:.0f} MiB; "
                 f"{c['seconds']:.1f} s"]
        if "cost_model_hardware" in c:  # (runs recorded before these keys have none)
            lines.append(f"estimates: cost model '{c['cost_model']}' ({c['cost_model_hardware']}; measured at batch "
                         f"{c['cost_model_batch_size']:,}), at this run's batch {c['batch_size']:,}; the tables "
                         f"file's batch is {c['tables_batch_size']:,} (all devices together): search and plan show "
                         f"give the plan's estimate at that batch")
        for p in self.plans:
            lines.append("")
            lines.append(f"-- {p.name}: {p.plan.num_devices} devices, {len(p.plan.shards)} shards "
                         f"(algorithm: {(p.plan.provenance or {}).get('algorithm', '?')})")
            lines.append(p.per_device_table().round(3).to_string(index=False))
            lines.append(f"max compute {p.max_compute_ms:.3f} ms measured, {max(p.estimated_compute_ms):.3f} ms "
                         f"estimated; max/mean {p.balance:.3f}; estimate GMAE {100 * p.error_gmae:.1f}%, "
                         f"Spearman {p.error_spearman:.2f}; with modeled comm {p.max_total_ms:.3f} ms")
        rows = [{**p.summary(), "ratio_to_first": r} for p, r in zip(self.plans, self.ratios())]
        lines.append("")
        lines.append("plans, measured in this run (communication modeled, not measured):")
        table = pd.DataFrame(rows)[["plan", "devices", "max_compute_ms", "ratio_to_first", "balance",
                                    "estimated_max_compute_ms", "estimate_gmae", "estimate_spearman",
                                    "max_total_ms (measured compute + modeled comm)"]]
        lines.append(table.round(4).to_string(index=False))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"config": self.config, "ratios_to_first": self.ratios(), "plans": [p.to_dict() for p in self.plans]}

    def write_json(self, path: str | Path) -> Path:
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")


def _check_plans(plans: Mapping[str, Plan], tables: TableSet) -> None:
    for name, plan in plans.items():
        try:
            plan.validate()
            plan.check_matches(tables)
        except InvalidPlanError as exc:
            raise InvalidPlanError(f"plan '{name}': {exc}") from None
        if plan.data_parallel_tables:  # their lookups are per device's slice of the batch, in another kernel
            raise InvalidPlanError(f"plan '{name}': data-parallel table '{plan.data_parallel_tables[0]}' cannot be "
                                   f"timed device by device yet; measure the plan with `neuroshard evaluate`")


def measure_plans(plans: Mapping[str, Plan] | Sequence[Plan], tables: TableSet, *, batch_size: int | None = None,
                  cost_models: Any = None, **options: Any) -> MeasureResult:
    """Time every device of every plan in one interleaved run (``time_devices``; its
    options pass through) and return each plan's measured compute per device beside
    the cost models' estimate. ``batch_size`` defaults to the cost models' (the batch
    their data was measured at); the estimates are made at the same batch. ``plans``
    is a name -> plan mapping or a list (named plan0, plan1, ...)."""
    if not isinstance(plans, Mapping):
        plans = {f"plan{i}": p for i, p in enumerate(plans)}
    if not plans:
        raise NeuroShardError("no plan to measure")
    _check_plans(plans, tables)
    models = resolve_cost_models(cost_models)
    batch_size = batch_size or models.batch_size
    names = list(plans)
    devices = [plans[n].shards_on(d) for n in names for d in range(plans[n].num_devices)]
    precisions = {trained_precision(p.bytes_per_element) for p in plans.values()}
    if len(precisions) == 1:  # the plans' weights precision (int8 and 8-byte plans are timed at fp32)
        options.setdefault("weights_precision", precisions.pop())
    passes_ms, config = time_devices(devices, tables, batch_size=batch_size, **options)
    config.update(cost_model=models.name, tables_name=tables.name, cost_model_hardware=models.describe_hardware(),
                  cost_model_batch_size=models.batch_size, tables_batch_size=tables.batch_size)

    results, first = [], 0
    for name in names:
        plan = plans[name]
        mine = passes_ms[first:first + plan.num_devices]
        first += plan.num_devices
        compute = device_figures(mine, config)
        sim = Simulator.from_plan(plan, models, tables, batch_size)
        est = sim.evaluate_plan(plan)
        with_measured = sim.evaluate_plan(plan, compute)
        comm = (with_measured.fwd_comm_ms + with_measured.bwd_comm_ms + with_measured.reduce_ms)[0]
        results.append(PlanMeasurement(name, plan, compute, mine, est.compute_ms[0].tolist(), comm.tolist(),
                                       est.total_ms[0].tolist()))
    return MeasureResult(results, config)


def _figure_words(config: dict) -> str:
    """How a run's device figures were made, in words."""
    if config.get("figure", "fastest") == "fastest":
        return "the fastest"
    ref = config.get("reference", {})
    return (f"the median relative to a reference device timed before every turn (device {ref.get('device')}, "
            f"{ref.get('runs')} runs, fastest turn {ref.get('fastest_ms', 0):.3f} ms)")


def plan_names(paths: Sequence[str]) -> list[str]:
    """Short unique names for plan files: their stems, numbered when two collide."""
    stems = [Path(p).stem for p in paths]
    return [s if stems.count(s) == 1 else f"{s}#{i}" for i, s in enumerate(stems)]


__all__ = ["measure_plans", "estimate_gmae", "estimate_spearman", "MeasureResult", "PlanMeasurement", "plan_names"]
