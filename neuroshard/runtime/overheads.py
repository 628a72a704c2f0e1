"""Overheads of the included runtime, measured in real runs.

Operators timed alone (``collect dense``) miss what a training step adds around them: the
framework's dispatch and DDP's hooks around the dense operators, each collective's latency
beyond its bytes, the host work of data loading, the bookkeeping between terms, and the
slowdown of ranks sharing the machine's cores. Lin et al. measure these overheads from
real runs and add them to the operators' times; here ``calibrate_overheads`` trains a few
small configurations (``CALIBRATION_CONFIGS``: their own tables, dense models and batches,
never those the iteration model is judged on) on 2 and 3 real processes, compares each
term's measurement (``evaluate``'s breakdown) with the operators' prediction
(``search.iteration.operator_durations``), and returns the points that
``costmodels.dense.fit_overheads`` turns into ``measured = fixed + scale x predicted`` per
term and rank count. A collective's measurement includes waiting for the last rank, so its
points compare the ranks' minimum (the last arrival waits least) with the predicted
minimum. Last, the whole period: the critical path of the corrected terms against the
measured iteration (``ITERATION_KEY``): with more ranks than cores the ranks take turns on
them, which stretches the period beyond what any one term shows.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from ..constants import ITERATION_TERMS
from ..costmodels.base import CostModels
from ..costmodels.dense import ITERATION_KEY, OperatorModels
from ..datasets.families import generate
from ..model_spec import ModelSpec
from ..search.api import search_plan
from ..search.iteration import STEP_CHAIN, estimate_iteration, operator_durations
from .evaluate import evaluate_together

log = logging.getLogger(__name__)

#: terms that end in a collective: their measurement includes waiting for the last rank
COLLECTIVE_TERMS = tuple(term for term, collective in STEP_CHAIN if collective is not None)
#: (family, tables, seed, dense model, global batch, processes) of the calibration runs
CALIBRATION_CONFIGS: tuple[tuple[str, int, int, ModelSpec, int, int], ...] = (
    ("broad", 6, 101, ModelSpec(8, (32,), (32,), "dot", "tiny-dot"), 384, 2),
    ("dlrm-2021", 10, 102, ModelSpec(16, (512,), (256, 64), "cat", "wide-cat"), 1280, 2),
    ("criteo-terabyte", 8, 103, ModelSpec(13, (256, 128), (512, 256, 64), "dot", "deep-dot"), 2560, 2),
    ("broad", 14, 107, ModelSpec(13, (128, 64), (128,), "dot", "small-dot"), 896, 2),
    ("dlrm-2021", 6, 108, ModelSpec(4, (64,), (1024, 64), "cat", "top-cat"), 3072, 2),
    ("criteo-terabyte", 12, 109, ModelSpec(13, (64,), (64,), "dot", "narrow-dot"), 192, 2),
    ("broad", 7, 104, ModelSpec(8, (32,), (32,), "dot", "tiny-dot"), 640, 3),
    ("dlrm-2021", 11, 105, ModelSpec(16, (512,), (256, 64), "cat", "wide-cat"), 1920, 3),
    ("criteo-terabyte", 9, 106, ModelSpec(13, (256, 128), (512, 256, 64), "dot", "deep-dot"), 1152, 3),
    ("broad", 15, 110, ModelSpec(13, (128, 64), (128,), "dot", "small-dot"), 2304, 3),
    ("dlrm-2021", 8, 111, ModelSpec(4, (64,), (1024, 64), "cat", "top-cat"), 384, 3),
    ("criteo-terabyte", 13, 112, ModelSpec(13, (64,), (64,), "dot", "narrow-dot"), 3456, 3),
)
#: the plans each calibration configuration trains, interleaved in one run as plans are compared
#: (each rank then holds every plan's shards: memory and caches as in such a comparison)
CALIBRATION_ALGORITHMS = ("neuroshard", "size-lookup", "size", "dim")


def calibration_run(config: tuple, cost_models: CostModels, iterations: int = 12, warmup: int = 3,
                    algorithms: Sequence[str] = CALIBRATION_ALGORITHMS, backend: str = "auto") -> list[tuple]:
    """Train one calibration configuration's plans (one per algorithm) interleaved: ``(name,
    plan, tables, model, batch, measurement)`` per plan. ``backend``: the runs' torch.distributed
    backend (auto: nccl where torch sees a GPU, else gloo)."""
    family, count, seed, model, batch, devices = config
    tables = generate(family, num_tables=count, seed=seed)
    tables.batch_size = batch
    plans = [search_plan(tables, devices, "64GiB", name, cost_models=cost_models) for name in algorithms]
    measured = evaluate_together(plans, tables, devices, iterations=iterations, warmup=warmup, batch_size=batch,
                                 model=model, backend=backend)
    return [(name, plan, tables, model, batch, m) for name, plan, m in zip(algorithms, plans, measured)]


def overhead_points(config: tuple, runs: list[tuple], cost_models: CostModels, operators: OperatorModels,
                    run: int = 0) -> list[dict]:
    """One calibration configuration's points: per plan and term, predicted against measured."""
    family, count, seed, _, _, devices = config
    points = []
    for name, plan, tables, model, batch, m in runs:
        predicted, _ = operator_durations(plan, tables, cost_models, operators, model, batch)
        where = f"{family} x{count} seed {seed} {model.name} batch {batch} on {devices}: {name}"
        for term in ITERATION_TERMS:
            if term not in predicted[0] or term not in m.breakdown[0]:
                continue
            pred = [row[term] for row in predicted]
            meas = [row[term] for row in m.breakdown]
            pairs = [(min(pred), min(meas))] if term in COLLECTIVE_TERMS else list(zip(pred, meas))
            points += [{"term": term, "ranks": devices, "predicted_ms": round(float(p), 6),
                        "measured_ms": round(float(max(q, 0.0)), 6), "run": run, "config": where} for p, q in pairs]
    return points


def calibrate_overheads(cost_models: CostModels, operators: OperatorModels,
                        configs: Sequence[tuple] = CALIBRATION_CONFIGS, iterations: int = 12,
                        progress=None, algorithms: Sequence[str] = CALIBRATION_ALGORITHMS,
                        backend: str = "auto") -> OperatorModels:
    """``operators`` with the overheads of real runs of ``configs`` (module docstring), each run on
    ``backend`` (``calibration_run``)."""
    points: list[dict] = []
    runs = []
    for run, config in enumerate(configs):
        if progress is not None:
            progress(config)
        runs.append(calibration_run(config, cost_models, iterations, algorithms=algorithms, backend=backend))
        points += overhead_points(config, runs[-1], cost_models, operators, run=run)
    terms = OperatorModels(**operators.get_params()).fit(operators.samples_, operators.hardware_, points)
    # then the period: with more ranks than cores the ranks take turns on them, which no term's
    # own figure shows; the critical path of the corrected terms against the measured period
    for run, (config, plans) in enumerate(zip(configs, runs)):
        for name, plan, tables, model, batch, m in plans:
            predicted = estimate_iteration(plan, tables, cost_models, terms, model, batch)
            points.append({"term": ITERATION_KEY, "ranks": config[5], "predicted_ms": round(predicted.iteration_ms, 6),
                           "measured_ms": round(m.iteration_ms, 6), "run": run, "config": f"{config[0]}: {name}"})
    fitted = OperatorModels(**operators.get_params()).fit(operators.samples_, operators.hardware_, points)
    log.info("overheads: %s", {t: {r: tuple(np.round(v, 3)) for r, v in per.items()}
                               for t, per in fitted.overheads_.items()})
    return fitted
