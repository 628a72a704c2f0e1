"""How far this machine's timings drift between runs, seen by the calibrated model.

    python experiments/calibration_drift.py --family criteo-kaggle --devices 8

Calibrates the shipped cost models on one task of ``--family`` (``neuroshard.costmodels.
calibrate.start_calibration``: the tables alone and ``--sets`` random device-sized sets),
then, in one later interleaved run, times again the calibration's held-out random sets,
the devices of NeuroShard's and size-lookup's plans (searched against the calibrated
models) and the devices of random placements of the task's pieces. Per group it prints
the calibrated model's MAPE (arithmetic mean of absolute relative errors; figures
printed before 2026-11-25 were mislabelled GMAE), its bias (median predicted / measured)
and the pre-trained model's MAPE. The held-out sets' error at calibration time is in the report line: the
same sets timed again minutes later show how much of a model's error is the machine's
drift, which no model can predict.
"""
from __future__ import annotations

import argparse
import logging

import numpy as np

from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.metrics import mape
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.measured.calibrate import start_calibration
from neuroshard.search.api import shard
from neuroshard.search.simulator import Simulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="criteo-kaggle", choices=sorted(FAMILIES))
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--sets", type=int, default=120, help="random calibration sets (default: 120)")
    parser.add_argument("--passes", type=int, default=3, help="runs per set in the later run (median)")
    parser.add_argument("--cost-model", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    models = load_cost_models(args.cost_model)
    tables, memory = family_tasks(args.family, args.devices, args.task + 1, (10, 20))[args.task]
    calibration = start_calibration(tables, models, devices=args.devices, sets=args.sets, seed=args.task)
    calibrated, report = calibration.fit()
    print(report.format())
    groups = {"held-out random sets, timed again": [calibration.sets[i] for i in calibration.held_out[0]]}
    for algorithm in ("neuroshard", "size-lookup"):
        plan = shard(tables, args.devices, memory, algorithm=algorithm, cost_models=calibrated, seed=args.task)
        groups[f"{algorithm} plan's devices"] = calibration.sim.device_sets(plan)
    split = Simulator(tables, args.devices, calibrated).memory_split(memory)
    rng = np.random.default_rng(args.task)
    groups["random placements of the pieces"] = [[p for p, d in zip(split, where) if d == k]
                                                 for where in rng.integers(args.devices, size=(3, len(split)))
                                                 for k in range(args.devices)]
    every = [s for sets in groups.values() for s in sets if s]
    times = iter(calibration.time(every, args.passes))
    print(f"{'group':36s} sets  pieces  calibrated MAPE  bias  pre-trained MAPE  measured ms (median)")
    for name, sets in groups.items():
        sets = [s for s in sets if s]
        measured = np.array([next(times) for _ in sets])
        after, before = calibration.predict(sets, calibrated), calibration.predict(sets)
        print(f"{name:36s} {len(sets):4d}  {np.median([len(s) for s in sets]):6.0f}  "
              f"{100 * mape(after, measured):14.1f}%  {np.exp(np.median(np.log(after / measured))):.3f}"
              f"  {100 * mape(before, measured):15.1f}%  {np.median(measured):8.2f}")


if __name__ == "__main__":
    main()
