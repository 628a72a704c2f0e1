"""Does the work model's second opinion make calibrated plans measure better? (issue 25, item 2)

One task of a family, calibrated on this machine (``neuroshard search --calibrate``'s
measurements), searched twice with the calibrated models: as shipped (the members' spread
and the work model's excess over them charged, ``costmodels.ensemble``) and with the work
model removed; both plans, lookup's and size-lookup's, and a second copy of the plan without
the work model (an A/A control) timed device by device in one interleaved run
(``neuroshard measure``'s protocol). Prints each plan's measured max device, its ratio to the
best baseline, the calibrated models' ranking of the plans, and the work model's.

    python experiments/work_model.py --family criteo-terabyte --devices 8 --seed 169
"""
from __future__ import annotations

import argparse
import copy
import logging

import numpy as np

from device_composition import task_plans
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.measured.calibrate import start_calibration
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import shard
from neuroshard.topology import Topology


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="criteo-terabyte")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--seed", type=int, default=169)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    models = load_cost_models(None)
    tables, plans = task_plans(args.family, args.devices, args.seed, ["lookup", "size-lookup"], models)
    print(f"# {args.family}, {args.devices} devices, seed {args.seed}, {len(tables)} tables ({cpu_model()})")
    calibration = start_calibration(tables, models, devices=args.devices)
    hedged, report = calibration.fit()
    print(report.format())
    plain = copy.deepcopy(hedged)
    plain.compute.work_model_ = None
    print("work model:", hedged.compute.work_model_)
    one_host = Topology(args.devices, local_world_size=args.devices)
    search = dict(topology=one_host, seed=0, row_blocks="any")
    plans["work-model"] = shard(tables, args.devices, tables_memory(tables, args), cost_models=hedged, **search)
    plans["no-work-model"] = shard(tables, args.devices, tables_memory(tables, args), cost_models=plain, **search)
    plans["no-work-model A/A"] = copy.deepcopy(plans["no-work-model"])
    only = copy.deepcopy(hedged)
    only.compute.predict_with_spread = lambda sets: (only.compute.predict_work(sets), np.zeros(len(sets)))
    plans["work-model only"] = shard(tables, args.devices, tables_memory(tables, args), cost_models=only, **search)
    same = plans["work-model"].layout_key() == plans["no-work-model"].layout_key()
    print(f"the two searches {'wrote the same plan' if same else 'wrote different plans'}")
    measured = {p.name: np.asarray(p.compute_ms) for p in measure_plans(plans, tables, cost_models=models).plans}
    best = min(measured[n].max() for n in ("lookup", "size-lookup"))
    for name, plan in plans.items():
        sets = calibration.sim.device_sets(plan)
        used = [s for s in sets if s]
        neural = calibration.predict(used, plain).max()
        work = hedged.compute.predict_work([calibration.sim.features_of(calibration.sim.piece_ids(s)) for s in used]).max()
        m = measured[name]
        print(f"{name:18s} shards {len(plan.shards):3d}  measured max {m.max():7.2f} ms (x{m.max() / best:.3f} of the best "
              f"baseline), total {m.sum():7.1f}  |  calibrated max {neural:7.2f}, work model max {work:7.2f}")


def tables_memory(tables, args):
    from neuroshard.datasets.families import family_tasks
    return family_tasks(args.family, args.devices, 1, (8, 12), seed=args.seed)[0][1]


if __name__ == "__main__":
    main()
