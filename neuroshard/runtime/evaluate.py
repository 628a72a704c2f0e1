"""Measure a plan: run training iterations and report, per device, the quantities the
cost models predict (embedding compute, forward and backward communication, their
total) as medians over the iterations after warm-up, and their max over devices.

Compute runs the fused kernel the cost data was measured with and is timed on the
same clock (thread CPU time on CPU), so a plan's measured and predicted costs
compare; ``compute_wall_ms`` is its wall-clock figure.

A plan with cached shards (rows in host memory or on SSD) also gets, per cached table, its
cache's measured miss rate and the time of its miss path on this CPU (``cache``, over the
second half of the plan's steps: ``runtime.cached``); the miss path is not part of
``total_ms`` (the tier's cost model, ``costmodels.tiers``, estimates it apart).

The whole training iteration is measured too: ``iteration_ms``, the median over the
measured steps of the ranks' mean period (step to step, wall clock), and per rank its
breakdown into the terms of ``constants.ITERATION_TERMS`` (``trainer``), the terms that
``neuroshard estimate`` predicts, averaged over its typical steps (``iteration_terms``)."""
from __future__ import annotations

import json
import logging
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ..constants import ITERATION_TERMS, TURN_STEPS
from ..errors import NeuroShardError
from ..io import atomic_write_text
from ..plan import Plan
from ..tables import TableSet
from ..validate import MAX_STEPS, check_int
from .cached import cache_summary, format_cache
from .trainer import PHASES, RunConfig, RunResult, check_run, check_turn, run

log = logging.getLogger(__name__)

DEFAULT_WARMUP = 3


@dataclass
class Measurement:
    """Per-device medians (ms) of one measured run of a plan."""

    plan: Plan
    per_device: list[dict]
    iterations: int  # measured, after warm-up
    warmup: int
    batch_size: int
    backend: str
    kernel: str = ""
    clock: str = ""
    cache: dict = field(default_factory=dict)  # per cached table (``cached.cache_summary``); empty without
    iteration_ms: float | None = None  # median over the steps of the ranks' mean period
    breakdown: list[dict] = field(default_factory=list)  # per rank: its typical iteration (``iteration_terms``)

    @property
    def per_device_cost_ms(self) -> list[float]:
        return [d["total_ms"] for d in self.per_device]

    @property
    def max_device_cost_ms(self) -> float:
        return max(self.per_device_cost_ms)

    @property
    def iterations_per_s(self) -> float:
        """Training iterations per second: ``1000 / iteration_ms`` (the whole period, input and
        barrier included); without a measured period, the slowest device's median ``step_ms``."""
        if self.iteration_ms:
            return 1e3 / self.iteration_ms
        return 1e3 / max(d["step_ms"] for d in self.per_device)

    def table(self):
        """One row per device plus a 'max' row (pandas DataFrame, milliseconds)."""
        import pandas as pd
        df = pd.DataFrame(self.per_device)
        top = {"device": "max", "shards": int(df["shards"].max())}
        top.update({c: float(df[c].max()) for c in df.columns if c.endswith("_ms")})
        return pd.concat([df, pd.DataFrame([top])], ignore_index=True)

    def terms_table(self):
        """One row per iteration term, then the period; one column per rank (pandas DataFrame,
        milliseconds): each column adds up to its period."""
        import pandas as pd
        df = pd.DataFrame(self.breakdown).T
        df.columns = [f"rank {rank}" for rank in df.columns]
        return df

    def format(self) -> str:
        """The table as text, with a header and the plan's estimate beside it when it has one,
        then the iteration time and each rank's terms (when measured)."""
        head = (f"measured plan for '{self.plan.tables_name}' on {len(self.per_device)} devices ({self.backend}, "
                f"kernel {self.kernel}, compute on the {self.clock} clock): batch {self.batch_size}, median of {self.iterations} iterations "
                f"after {self.warmup} warm-up")
        estimate = self.plan.estimate or {}
        est = estimate.get("max_device_cost_ms")
        tail = f"\nmax device cost: {self.max_device_cost_ms:.3f} ms measured at batch {self.batch_size:,}"
        if est is not None:
            at = estimate.get("batch_size")
            where = (self.plan.provenance or {}).get("cost_model_hardware")
            tail += (f", {float(est):.3f} ms estimated by the plan" + (f" at batch {int(at):,}" if at else "")
                     + (f" for {where}" if where else ""))
            if at and int(at) != self.batch_size:  # like with like: the estimate scaled linearly to this batch
                tail += f" ({float(est) * self.batch_size / int(at):.3f} ms at batch {self.batch_size:,}, linearly)"
        cache = ("\n" + format_cache(self.cache)) if self.cache else ""
        iteration = ""
        if self.iteration_ms is not None:
            iteration = (f"\niteration: {self.iteration_ms:.3f} ms per step (median after warm-up), "
                         f"{1e3 / self.iteration_ms:.2f} iterations/s\n"
                         + self.terms_table().round(3).to_string())
        return head + "\n" + self.table().round(3).to_string(index=False) + cache + tail + iteration

    def to_dict(self) -> dict:
        return {"tables_name": self.plan.tables_name, "num_devices": len(self.per_device),
                "backend": self.backend, "kernel": self.kernel, "clock": self.clock, "batch_size": self.batch_size, "iterations": self.iterations,
                "warmup": self.warmup, "max_device_cost_ms": self.max_device_cost_ms,
                "per_device_cost_ms": self.per_device_cost_ms, "iterations_per_s": self.iterations_per_s,
                "per_device": self.per_device, "iteration_ms": self.iteration_ms,
                "breakdown": {"per_rank": self.breakdown,
                              "terms": [t for t in ITERATION_TERMS if self.breakdown and t in self.breakdown[0]]},
                "estimate": self.plan.estimate,
                **({"cache": self.cache} if self.cache else {})}

    def write_json(self, path: str | Path) -> Path:
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")


def iteration_terms(kept: Sequence[dict]) -> dict:
    """One rank's iteration terms (those of ``ITERATION_TERMS`` its records have) and its
    ``period_ms``, each the mean over its typical steps: the middle half of ``kept`` by period
    (the first to the third quartile; all of them when fewer than 4). Means over the same steps
    add up as the steps do, so the terms sum to the period exactly; medians taken term by term
    would not: a shared machine's slow spells land on one term or another, and what the terms'
    medians leave of the median period (milliseconds on a busy CPU) is noise, not work."""
    by_period = sorted(kept, key=lambda r: r["period_ms"])
    quarter = len(by_period) // 4
    typical = by_period[quarter:len(by_period) - quarter]
    names = [t for t in ITERATION_TERMS if t in kept[0]] + ["period_ms"]
    return {name: statistics.fmean(r[name] for r in typical) for name in names}


def settled_steps(records: Sequence[dict], which: int, warmup: int) -> list[dict]:
    """The steps of plan number ``which`` that a measurement keeps: after the plan's first
    ``warmup`` steps, those that follow a step of the same plan (the first step of a run
    counts as following its own plan). A step right after another plan's is its switch step
    (``RunConfig.turn``): its barrier waits for the other plan's slowest rank, its caches hold
    the other plan's rows; measured, that waiting was charged to the plan that did not cause
    it (``constants.TURN_STEPS``)."""
    mine = [(i, r) for i, r in enumerate(records) if r.get("plan", 0) == which]
    return [r for i, r in mine[warmup:] if i == 0 or records[i - 1].get("plan", 0) == which]


def steps_per_plan(iterations: int, warmup: int, plans: int, turn: int = TURN_STEPS) -> int:
    """How many steps each of ``plans`` plans must run, in turns of ``turn`` steps, for
    ``iterations`` of them to be kept after ``warmup`` (``settled_steps``)."""
    if plans == 1:
        return warmup + iterations
    steps = kept = 0
    while kept < iterations:
        if steps >= warmup and steps % turn != 0:  # a turn's first step is its switch step
            kept += 1
        steps += 1
    return -(-steps // turn) * turn  # whole turns: every plan's turns line up


def summarize(plan: Plan, result: RunResult, warmup: int, batch_size: int, which: int = 0,
              iterations: int | None = None) -> Measurement:
    """Medians per device over the settled steps of plan number ``which`` after its first
    ``warmup`` (``settled_steps``, the first ``iterations`` of them when given; each device's
    total is the median of its per-step totals, not the sum of medians); the iteration time
    (the median over those steps of the ranks' mean period) and each rank's iteration terms."""
    per_device, breakdown, kept_by_rank = [], [], []
    for rank, records in enumerate(result.records):
        mine = [r for r in records if r.get("plan", 0) == which]
        kept = settled_steps(records, which, warmup)[:iterations] or mine
        steps = len(kept)
        kept_by_rank.append(kept)
        breakdown.append(iteration_terms(kept))
        row: dict = {"device": rank, "shards": len(plan.shards_on(rank))}
        phases = PHASES + (("allreduce_ms",) if "allreduce_ms" in kept[0] else ())  # data-parallel tables
        for phase in phases:
            row[phase] = statistics.median(r[phase] for r in kept)
        row["total_ms"] = statistics.median(sum(r[p] for p in phases) for r in kept)
        row["compute_wall_ms"] = statistics.median(r["compute_wall_ms"] for r in kept)
        row["dense_ms"] = statistics.median(r["dense_ms"] for r in kept)
        row["step_ms"] = statistics.median(r["step_ms"] for r in kept)
        per_device.append(row)
    # every rank passes the same barriers, so their periods differ only by where each one's
    # loop top falls; the slowest rank's would add scheduling jitter (the max of noisy figures)
    iteration_ms = statistics.median(statistics.fmean(r["period_ms"] for r in step) for step in zip(*kept_by_rank))
    used_warmup = warmup if len(mine) > warmup else 0
    return Measurement(plan, per_device, steps, used_warmup, batch_size, result.backend,
                       result.kernel, result.clock, cache_summary(plan, result.records, which), iteration_ms,
                       breakdown)


def evaluate(plan: Plan, tables: TableSet, devices: int | None = None, iterations: int = 20,
             warmup: int = DEFAULT_WARMUP, batch_size: int | None = None, **options) -> Measurement | None:
    """Run ``iterations`` training steps of ``plan`` and measure every device (None on
    ranks other than 0 under torchrun). ``options`` go to ``RunConfig`` (lr, seed,
    row_cap, backend, kernel, timeout_s, fault)."""
    measured = evaluate_together([plan], tables, devices, iterations, warmup, batch_size, **options)
    return None if measured is None else measured[0]


def evaluate_together(plans: Sequence[Plan], tables: TableSet, devices: int | None = None, iterations: int = 20,
                      warmup: int = DEFAULT_WARMUP, batch_size: int | None = None, turn: int = TURN_STEPS,
                      **options) -> list[Measurement] | None:
    """Measure plans of the same tables in one run, taking turns of ``turn`` steps (A A A B B B
    ...: ``RunConfig.alternates``), ``iterations`` measured steps each, switch steps left out
    (``settled_steps``): one ``Measurement`` per plan, in order."""
    plans = list(plans)
    if not plans:
        raise NeuroShardError("no plan to measure")
    check_int(iterations, "iterations", 1, MAX_STEPS)
    check_int(warmup, "warmup", 0, MAX_STEPS)
    check_turn(turn, len(plans))  # before steps_per_plan, which counts on it
    devices = devices if devices is not None else max(p.num_devices for p in plans)
    for plan in plans:
        check_run(plan, tables, devices)
    batch_size = batch_size if batch_size is not None else tables.batch_size
    config = RunConfig(plans[0], list(tables), devices,
                       steps=len(plans) * steps_per_plan(iterations, warmup, len(plans), turn),
                       batch_size=batch_size, alternates=plans[1:], turn=turn, **options)
    result = run(config)
    if result is None:
        return None
    return [summarize(plan, result, warmup, batch_size, which, iterations) for which, plan in enumerate(plans)]


def measure_alternating(plans: dict[str, Plan], tables: TableSet, runs: int = 3, iterations: int = 20,
                        devices: int | None = None, **options) -> dict[str, list[Measurement]]:
    """Measure several plans of the same tables in ``runs`` runs, each running all
    plans in turns (``evaluate_together``; the order rotates from
    run to run), so a slow spell of a shared machine hits every plan alike.
    Returns each plan's measurements, one per run."""
    if runs < 1:
        raise NeuroShardError(f"runs must be at least 1, got {runs}")
    names = list(plans)
    out: dict[str, list[Measurement]] = {name: [] for name in names}
    for index in range(runs):
        order = names[index % len(names):] + names[:index % len(names)]
        log.info("run %d of %d: %s interleaved", index + 1, runs, ", ".join(order))
        measured = evaluate_together([plans[n] for n in order], tables, devices, iterations, **options)
        for name, measurement in zip(order, measured):
            out[name].append(measurement)
    return out


@dataclass
class PairedRuns:
    """``measure_paired``'s measurements: each other plan beside the anchor in a window of its
    own, ``runs`` paired measurements each (its own, the anchor's in the same steps)."""

    anchor: str
    beside: dict[str, list[tuple[Measurement, Measurement]]]  # plan -> per run: (the anchor's, its own)

    @property
    def names(self) -> list[str]:
        return [self.anchor, *self.beside]

    def measurements(self, name: str, beside: str | None = None) -> list[Measurement]:
        """A plan's measurement per run; the anchor's: those beside plan ``beside`` (the first other's
        when None)."""
        if name != self.anchor:
            return [own for _, own in self.beside[name]]
        return [anchor for anchor, _ in self.beside[beside or next(iter(self.beside))]]

    def costs_ms(self) -> dict[str, list[float]]:
        """Each plan's slowest-device cost per run, on one scale: the anchor's, the geometric mean over
        the windows of its cost in that run; another plan's, its ratio to the anchor in its own window
        times that. Ratios between any plan and the anchor are then exactly the paired ones."""
        runs = len(next(iter(self.beside.values())))
        anchor = [float(np.exp(np.mean([np.log(pairs[r][0].max_device_cost_ms) for pairs in self.beside.values()])))
                  for r in range(runs)]
        costs = {self.anchor: anchor}
        for name, pairs in self.beside.items():
            costs[name] = [own.max_device_cost_ms / mine.max_device_cost_ms * anchor[r]
                           for r, (mine, own) in enumerate(pairs)]
        return costs


def paired_window_steps(iterations: int, warmup: int, runs: int, turn: int = TURN_STEPS) -> list[int]:
    """The steps per plan of each run of a ``measure_paired`` window, in whole turns: the first run's
    after ``warmup``, each later run's after the switch step it starts with."""
    return [steps_per_plan(iterations, warmup if r == 0 else 1, 2, turn) for r in range(runs)]


def measure_paired(plans: dict[str, Plan], tables: TableSet, runs: int = 3, iterations: int = 20,
                   devices: int | None = None, warmup: int = DEFAULT_WARMUP, batch_size: int | None = None,
                   turn: int = TURN_STEPS, **options) -> PairedRuns:
    """Measure several plans of the same tables with two plans' embeddings held at most: the first
    plan (the anchor) beside each other plan in turn, in one launch of ``devices`` processes. In
    each plan's window the two take turns of ``turn`` steps (``RunConfig.paired``), the window cut
    into ``runs`` runs of ``iterations`` measured steps each, so every run pairs the two on the same
    stretch of time. ``options`` go to ``RunConfig`` (``progress``: a progress line's mode).
    (``measure_alternating`` holds every plan's embeddings in every process.)"""
    names = list(plans)
    if len(names) < 2:
        raise NeuroShardError("measure_paired compares plans: give at least two")
    check_int(runs, "runs", 1, MAX_STEPS)
    check_int(iterations, "iterations", 1, MAX_STEPS)
    check_int(warmup, "warmup", 0, MAX_STEPS)
    check_turn(turn, 2)
    order = [plans[n] for n in names]
    devices = devices if devices is not None else max(p.num_devices for p in order)
    for plan in order:
        check_run(plan, tables, devices)
    batch_size = batch_size if batch_size is not None else tables.batch_size
    per_run = paired_window_steps(iterations, warmup, runs, turn)
    window = 2 * sum(per_run)
    config = RunConfig(order[0], list(tables), devices, steps=window * (len(order) - 1), batch_size=batch_size,
                       alternates=order[1:], turn=turn, paired=True, **options)
    log.info("%d windows of %d steps: %s beside %s", len(order) - 1, window, names[0], ", ".join(names[1:]))
    result = run(config)
    beside: dict[str, list[tuple[Measurement, Measurement]]] = {}
    for k, name in enumerate(names[1:]):
        pairs, start = [], k * window
        for r, steps in enumerate(per_run):
            view = replace(result, records=[records[start:start + 2 * steps] for records in result.records])
            used = warmup if r == 0 else 1  # a later run starts with the anchor's switch step
            pairs.append(tuple(summarize(plan, view, used, batch_size, which, iterations)
                               for which, plan in ((0, order[0]), (k + 1, order[k + 1]))))
            start += 2 * steps
        beside[name] = pairs
    return PairedRuns(names[0], beside)


def paired_improvement(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """How much cheaper (fraction) ``ours`` is than ``theirs`` over paired runs: one
    minus the geometric mean of the per-run ratios ours/theirs."""
    ratios = np.asarray(ours, dtype=np.float64) / np.asarray(theirs, dtype=np.float64)
    return float(1.0 - np.exp(np.log(ratios).mean()))
