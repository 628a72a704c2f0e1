"""Does the order of devices in an interleaved run change how far two copies of a plan land apart?

copy_noise.py: copies of a device timed side by side agree within 1.2% (sd), copies as far
apart as a plan's devices 2.6%: the machine drifts slowly, and the reference device beside
every turn removes only part of it. ``measure`` times plan after plan (all of plan A's devices,
then all of B's, rotated every pass), so a slow stretch lands on one plan's devices together.
This times two copies of one plan (an A/A) ``--runs`` times in each of two orders, alternating:
``block`` (A's devices, then B's: measure's order) and ``interleaved`` (A0 B0 A1 B1 ...), and
prints each run's A/A ratio of the slowest device and of the total.

    python experiments/order_aa.py experiments/results/refine_trace/run2/refined.json [--runs 4]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from neuroshard.costmodels.measure.timing import device_figures, time_devices
from neuroshard.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from refine_trace import add_task_arguments, benchmark_task  # the task's options, in one place


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan")
    add_task_arguments(parser)
    parser.add_argument("--runs", type=int, default=4, help="runs of each order (default: 4)")
    args = parser.parse_args()
    tables, _ = benchmark_task(args)
    plan = Plan.read(args.plan)
    sets = [plan.shards_on(d) for d in range(plan.num_devices)]
    n = len(sets)
    orders = {"block": [(c, d) for c in (0, 1) for d in range(n)],
              "interleaved": [(c, d) for d in range(n) for c in (0, 1)]}
    results = {name: [] for name in orders}
    for run in range(args.runs):
        for name, order in orders.items():
            passes, config = time_devices([sets[d] for _, d in order], tables, progress=False)
            figures = device_figures(passes, config)
            copy = np.zeros((2, n))
            for (c, d), f in zip(order, figures):
                copy[c, d] = f
            ratio_max = copy[1].max() / copy[0].max()
            ratio_total = copy[1].sum() / copy[0].sum()
            per_device = np.abs(copy[1] / copy[0] - 1).mean()
            results[name].append((ratio_max, ratio_total, per_device))
            print(f"run {run} {name:12s} A/A max {ratio_max:.3f}  total {ratio_total:.3f}  "
                  f"mean |device ratio - 1| {100 * per_device:.1f}%  ({config['seconds']} s)", flush=True)
    for name, rows in results.items():
        r = np.array(rows)
        print(f"{name:12s} over {len(r)} runs: mean |A/A max - 1| {100 * np.abs(r[:, 0] - 1).mean():.1f}% "
              f"(widest {100 * np.abs(r[:, 0] - 1).max():.1f}%), mean |A/A total - 1| "
              f"{100 * np.abs(r[:, 1] - 1).mean():.1f}%, mean |device ratio - 1| {100 * r[:, 2].mean():.1f}%")


if __name__ == "__main__":
    main()
