"""Do the hot tables pay split, placed by the calibrated models? The search's plan with its split
margin (5%: a split state is kept only when simulated that much cheaper) against the same search
keeping its best split state whatever the simulation says (``split_margin=-1``), each against the
calibrated ensemble and against its work model, timed with two greedy baselines in interleaved runs.

    python experiments/forced_split.py --family criteo-terabyte --devices 8 --seed 169 --runs 3

On criteo-terabyte at 8 devices three pooling-100 tables, each about the mean device alone, sit on
devices that measure 1.1-1.25x the others in every plan (``device_signal.py``): the beam splits one
table a step and sees no gain while the other two remain, so the search also tries every table
costlier than half the mean device split at once (``search.neuroshard.HALF_HEAVY_SHARE``). This
asks whether that split, placed by the models, measures cheaper. One calibration (the task's
tables alone and 120 random sets) serves all plans; each run times every distinct plan's devices
together (``measured.refine``'s protocol); per plan: each run's cost (slowest device, measured
compute) and total compute, then the median over runs of both over the best baseline's.
"""
from __future__ import annotations

import argparse

import numpy as np

from device_composition import add_task_arguments, task_from_args
from neuroshard.costmodels.ensemble import work_cost_models
from neuroshard.measured.calibrate import start_calibration
from neuroshard.measured.refine import _time_plans
from neuroshard.search.api import shard
from neuroshard.topology import Topology

BASELINES = ("size-lookup", "lookup")
#: random calibration sets (plan_benchmark's default)
CALIBRATION_SETS = 120


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap, seed=169)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    models, tables, memory, baselines = task_from_args(args, BASELINES)
    calibration = start_calibration(tables, models, devices=args.devices, sets=CALIBRATION_SETS, seed=0)
    calibrated, report = calibration.fit()
    print(f"# calibrated: held-out GMAE {100 * report.gmae_before:.1f}% -> {100 * report.gmae_after:.1f}%")
    one_host = Topology(args.devices, local_world_size=args.devices)
    named = list(baselines.items())
    for margin in (0.05, -1.0):
        for label, cost_models in (("calibrated", calibrated), ("work", work_cost_models(calibrated))):
            plan = shard(tables, args.devices, memory, cost_models=cost_models, topology=one_host, seed=0,
                         row_blocks="any", split_margin=margin)
            named.append((f"neuroshard-{label} split_margin={margin}", plan))
    distinct, first = [], {}
    for name, plan in named:
        key = plan.layout_key()
        print(f"{name}: {len(plan.shards)} shards for {len(tables)} tables"
              + (f" (the same plan as {first[key]})" if key in first else ""))
        if key not in first:
            first[key] = name
            distinct.append((name, plan))
    plans = [p for _, p in distinct]
    costs, totals = np.zeros((args.runs, len(plans))), np.zeros((args.runs, len(plans)))
    for run in range(args.runs):
        for cost, i, compute in _time_plans(plans, list(range(len(plans))), tables, calibration, calibrated):
            costs[run, i], totals[run, i] = cost, float(np.sum(compute))
            print(f"run {run} {distinct[i][0]}: max {cost:.2f} ms, total {totals[run, i]:.1f} ms, devices "
                  f"{np.round(compute, 1).tolist()}", flush=True)
    cost, total = np.median(costs, axis=0), np.median(totals, axis=0)
    base = [i for i, (n, _) in enumerate(distinct) if n in BASELINES]
    best, least = min(cost[base]), min(total[base])
    print("\n# median over the runs, over the best baseline's max and the least baseline total")
    for i, (name, _) in enumerate(distinct):
        print(f"{name:45s} max {cost[i]:7.2f} ms  {cost[i] / best:.3f}   total {total[i]:7.1f} ms  {total[i] / least:.3f}")


if __name__ == "__main__":
    main()
