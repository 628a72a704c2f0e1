"""Pre-trained compute models on families they never saw: error on the devices of real plans.

    python experiments/heldout_accuracy.py --cost-model A.pt B.pt --devices 8 --tasks 2

For each family and task (``datasets.families.family_tasks``, as ``plan_benchmark.py``),
the plans of NeuroShard (searched against each checkpoint in turn), size-lookup and lookup
are cut into their devices, every device set of a task is timed in ONE interleaved run on this
machine (``neuroshard measure``'s protocol, median of ``--passes``), and each checkpoint
predicts every set. Printed per family and checkpoint: MAPE (arithmetic mean of absolute
relative errors; printed as 'GMAE' before 2026-11-25), bias (median predicted /
measured: the part of the error that is this machine's level, not the model's shape),
MAPE after removing that level, and the Spearman of devices within a plan (mean over
plans). No calibration: this is what a user gets before measuring anything.
"""
from __future__ import annotations

import argparse
import logging

import numpy as np
from scipy.stats import spearmanr

from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.measured.calibrate import Calibration
from neuroshard.search.api import shard

HELD_OUT = ("criteo-kaggle", "criteo-terabyte", "dlrm-2021")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost-model", nargs="+", default=[None], help="checkpoints (default: the shipped one)")
    parser.add_argument("--families", nargs="+", default=list(HELD_OUT), choices=sorted(FAMILIES))
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    checkpoints = [(str(path or "shipped"), load_cost_models(path)) for path in args.cost_model]
    print(f"{'family':16s} {'checkpoint':40s} sets  MAPE   bias  MAPE/level  Spearman")
    for family in args.families:
        plans = []  # (timer, device sets, measured ms) of every plan of every task
        for index, (tables, memory) in enumerate(family_tasks(family, args.devices, args.tasks, (10, 20))):
            timer = Calibration(tables, checkpoints[0][1])  # times and describes sets of pieces
            algorithms = [("neuroshard", models) for _, models in checkpoints] + [("size-lookup", None),
                                                                                  ("lookup", None)]
            task = [[s for s in timer.sim.device_sets(shard(tables, args.devices, memory, algorithm=algorithm,
                                                            cost_models=models, seed=index)) if s]
                    for algorithm, models in algorithms]
            times = iter(timer.time([s for sets in task for s in sets], args.passes))  # one interleaved run
            plans += [(timer, sets, np.array([next(times) for _ in sets])) for sets in task]
        for name, models in checkpoints:
            ratios, spearman = [], []
            for timer, sets, measured in plans:
                predicted = timer.predict(sets, models)
                ratios.append(predicted / measured)
                if len(sets) > 2:
                    spearman.append(spearmanr(predicted, measured)[0])
            ratio = np.concatenate(ratios)
            level = np.exp(np.median(np.log(ratio)))
            print(f"{family:16s} {name[-40:]:40s} {len(ratio):4d} {100 * np.mean(np.abs(ratio - 1)):5.1f}% "
                  f"{level:5.2f}  {100 * np.mean(np.abs(ratio / level - 1)):9.1f}%  {np.nanmean(spearman):+8.2f}")


if __name__ == "__main__":
    main()
