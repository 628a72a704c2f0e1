"""Replicating a small, hot table: what the search decides, what it predicts, what the runtime measures.

    python experiments/data_parallel.py                   # 2 devices, 3 runs of 10 steps (about 1-2 min)
    python experiments/data_parallel.py --no-measure      # the search and its estimates only

One task: a hot 2,000 x 64 table (80 lookups per sample) among four larger, colder
ones, batch 4096. The NeuroShard search plans it with ``data_parallel="never"`` and
``"auto"`` against the shipped cost models; printed per plan: the replicated tables and
each device's estimated compute, all-to-all (forward + backward) and all-reduce. Both
plans then run on the training runtime (``measure_alternating``: gloo processes, the two
plans' steps interleaved, compute on the thread clock) and the measured slowest device
of each round is printed with the paired improvement.
"""
from __future__ import annotations

import argparse
import logging

from neuroshard.costmodels import load_cost_models
from neuroshard.runtime.evaluate import measure_alternating, paired_improvement
from neuroshard.search.api import shard
from neuroshard.tables import Table, TableSet

TASK = TableSet("dp-example", [Table("hot", 2_000, 64, 80.0), Table("big", 400_000, 64, 2.0),
                               Table("mid", 50_000, 32, 4.0), Table("m2", 80_000, 32, 3.0),
                               Table("m3", 20_000, 64, 1.0)], 4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10, help="runtime steps per plan and round (default: 10)")
    parser.add_argument("--no-measure", action="store_true", help="search and estimate only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    models = load_cost_models(None)
    plans = {mode: shard(TASK, devices=args.devices, memory="256MiB", cost_models=models, data_parallel=mode)
             for mode in ("never", "auto")}
    for mode, plan in plans.items():
        est = plan.estimate
        comm = [f + b for f, b in zip(est["per_device_fwd_comm_ms"], est["per_device_bwd_comm_ms"])]
        allreduce = est.get("per_device_allreduce_ms", [0.0] * plan.num_devices)
        print(f"data_parallel={mode}: replicated {plan.data_parallel_tables or 'none'}; estimated max device "
              f"{est['max_device_cost_ms']:.3f} ms")
        for d in range(plan.num_devices):
            print(f"   device {d}: compute {est['per_device_compute_ms'][d]:.3f}, all-to-all {comm[d]:.3f}, "
                  f"all-reduce {allreduce[d]:.3f} ms")
    if args.no_measure:
        return
    measured = measure_alternating(plans, TASK, runs=args.runs, iterations=args.iterations,
                                   devices=args.devices, batch_size=TASK.batch_size)
    costs = {mode: [m.max_device_cost_ms for m in runs] for mode, runs in measured.items()}
    for mode, values in costs.items():
        print(f"measured max device cost, data_parallel={mode}: " + ", ".join(f"{v:.2f}" for v in values) + " ms")
    print(f"measured improvement of auto over never: {100 * paired_improvement(costs['auto'], costs['never']):+.1f}% "
          f"(paired runs); estimated "
          f"{100 * (1 - plans['auto'].estimate['max_device_cost_ms'] / plans['never'].estimate['max_device_cost_ms']):+.1f}%")


if __name__ == "__main__":
    main()
