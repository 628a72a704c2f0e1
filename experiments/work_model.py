"""The calibration's work model as a second search objective (issue 25, item 2).

One task of a family, calibrated on this machine (``neuroshard search --calibrate``'s
measurements), searched against the calibrated ensemble and against the calibration's work
model alone (``costmodels.ensemble.WorkComputeModel``: linear in lookups x columns, shards and
weight bytes); both plans, lookup's and size-lookup's, and a second copy of the ensemble's
plan (an A/A control) timed device by device in one interleaved run (``neuroshard
measure``'s protocol). Prints each plan's measured max device, its ratio to the best
baseline, its total, and each model's predicted max device.

    python experiments/work_model.py --family criteo-terabyte --devices 8 --seed 169

Session 29 (AMD EPYC, family 25; docs/results.md): criteo-terabyte seed 169, ensemble 1.202x
(A/A copy 1.122x), work model 0.971x; dlrm-2021 seed 171, ensemble 0.895x, work model 0.958x.
A first version also charged the work model's excess over the ensemble as spread (the
search's risk): 1.145x and 0.995x on criteo-terabyte (two calibrations), 0.978x on
dlrm-2021, so that hedge was dropped and the work model's plan became a candidate that
measurement decides (refine, ``search --calibrate``).
"""
from __future__ import annotations

import argparse
import copy

import numpy as np

from device_composition import add_task_arguments, task_from_args
from neuroshard.costmodels.ensemble import work_cost_models
from neuroshard.measured.calibrate import start_calibration
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import shard
from neuroshard.topology import Topology


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap, seed=169)
    args = ap.parse_args()
    models, tables, memory, plans = task_from_args(args, ["lookup", "size-lookup"])
    calibration = start_calibration(tables, models, devices=args.devices)
    calibrated, report = calibration.fit()
    print(report.format())
    work = work_cost_models(calibrated)
    if work is None:
        raise SystemExit("calibration kept the pre-trained model: no work model to compare")
    print("work model:", calibrated.compute.work_model_.state_dict())
    search = dict(topology=Topology(args.devices, local_world_size=args.devices), seed=0, row_blocks="any")
    plans["ensemble"] = shard(tables, args.devices, memory, cost_models=calibrated, **search)
    plans["ensemble A/A"] = copy.deepcopy(plans["ensemble"])
    plans["work model"] = shard(tables, args.devices, memory, cost_models=work, **search)
    measured = {p.name: np.asarray(p.compute_ms) for p in measure_plans(plans, tables, cost_models=models).plans}
    best = min(measured[n].max() for n in ("lookup", "size-lookup"))
    for name, plan in plans.items():
        used = [s for s in calibration.sim.device_sets(plan) if s]
        features = [calibration.sim.features_of(calibration.sim.piece_ids(s)) for s in used]
        m = measured[name]
        print(f"{name:12s} shards {len(plan.shards):3d}  measured max {m.max():7.2f} ms (x{m.max() / best:.3f} of the "
              f"best baseline), total {m.sum():7.1f}  |  predicted max: ensemble "
              f"{calibrated.compute.predict(features).max():7.2f}, work model {work.compute.predict(features).max():7.2f}")


if __name__ == "__main__":
    main()
