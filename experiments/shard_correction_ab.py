"""Calibration with and without the shard correction: the plans each gives, measured in one run.

    python experiments/shard_correction_ab.py FAMILY DEVICES TASK [SEED]
    python experiments/shard_correction_ab.py hot-few 8 0 41      # one held-out task, about 3 minutes

One task of ``FAMILY`` (``family_tasks``: 8-12 tables per device, searched as one host).
Calibration (``start_calibration``, 48 random sets, the tables alone) is fitted twice on
the SAME measurements: with the shard correction (``cal-new``: each table's own error
from the tables timed alone, ``costmodels.ensemble``) and without it (``cal-old``: the
set-size correction only, the recipe before session 10). NeuroShard searches against
each, and against the pre-trained model (``pre``); the greedy baselines size-lookup and
lookup and measured-greedy plan too; every device of every plan, and measured-greedy's
plan a second time (the A/A control), is timed in ONE interleaved run
(``measure_plans``, 5 passes). Printed per plan: max device over the best baseline's,
total compute over the least baseline's, and max/mean balance.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.ensemble import EnsembleComputeModel
from neuroshard.datasets.families import family_tasks
from neuroshard.measured.calibrate import start_calibration
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import shard
from neuroshard.topology import Topology

BASELINES = ("size-lookup", "lookup", "measured-greedy")


def main(family: str, devices: int, task: int, seed: int = 31) -> None:
    tables, memory = family_tasks(family, devices, task + 1, tables_per_device=(8, 12), seed=seed)[task]
    models = load_cost_models()
    tables.batch_size = models.batch_size
    topology = Topology(devices, local_world_size=devices)
    calibration = start_calibration(tables, models, devices=devices, sets=48)
    new, report = calibration.fit()
    print("new", report.format())
    fit_shard_correction = EnsembleComputeModel.fit_shard_correction
    EnsembleComputeModel.fit_shard_correction = lambda self, *a, **k: self  # the recipe without it
    try:
        old, report = calibration.fit()
    finally:
        EnsembleComputeModel.fit_shard_correction = fit_shard_correction
    print("old", report.format())
    plans = {}
    for name, model, algorithm in [("cal-new", new, "neuroshard"), ("cal-old", old, "neuroshard"),
                                   ("pre", models, "neuroshard")] + [(b, models, b) for b in BASELINES]:
        start = time.time()
        plans[name] = shard(tables, devices, memory, algorithm=algorithm, cost_models=model, topology=topology,
                            seed=0)
        print(name, "shards", len(plans[name].shards), "est", round(plans[name].estimate["max_device_cost_ms"], 2),
              "t", round(time.time() - start, 1), flush=True)
    plans["A/A measured-greedy"] = plans["measured-greedy"]
    result = measure_plans(plans, tables, cost_models=new, passes=5)
    best = min(p.max_compute_ms for p in result.plans if p.name in BASELINES)
    least = min(sum(p.compute_ms) for p in result.plans if p.name in BASELINES)
    for p in result.plans:
        print("%-20s max %7.2f ratio %.3f total %.3f bal %.3f" % (
            p.name, p.max_compute_ms, p.max_compute_ms / best, sum(p.compute_ms) / least,
            p.max_compute_ms / np.mean(p.compute_ms)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 31)
