"""What a device of one task holds, and what it measures (issue 25, item 1): per device of a few
plans of one task, its shards, how many of them have more rows than ``measure`` allocates
(``kernels.DEFAULT_MAX_ROWS``, 1M: their working set is capped there), the capped and full
bytes, and its lookups x columns (pooling x width x the share of rows, summed); with
``--measure``, the plans' devices timed in one interleaved run (``neuroshard measure``'s protocol).

    python experiments/device_composition.py --family criteo-terabyte --devices 8 --seed 167 --measure

Session 27 (AMD EPYC, family 25): on that task lookups x columns drive a device's time, and
devices with similar lookups differ by up to 1.4x (experiments/results/device_composition.txt).
"""
from __future__ import annotations

import argparse
import logging

from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.datasets.families import family_tasks
from neuroshard.kernels import DEFAULT_MAX_ROWS
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import shard
from neuroshard.topology import Topology


def task_plans(family: str, devices: int, seed: int, algorithms, models):
    """One task of ``family`` at ``devices`` devices (``seed``) and its plans searched as one host:
    NeuroShard's with ``--row-blocks any``, the other names as baselines. Returns (tables, memory
    per device, plans)."""
    tables, memory = family_tasks(family, devices, 1, (8, 12), seed=seed)[0]
    one_host = Topology(devices, local_world_size=devices)
    plans = {}
    for name in algorithms:
        options = {"row_blocks": "any"} if name == "neuroshard" else {"algorithm": name}
        plans[name] = shard(tables, devices, memory, cost_models=models, topology=one_host, seed=0, **options)
    return tables, memory, plans


def add_task_arguments(ap: argparse.ArgumentParser, seed: int) -> None:
    """The options that name one task: ``--family``, ``--devices``, ``--seed``."""
    ap.add_argument("--family", default="criteo-terabyte")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--seed", type=int, default=seed)


def task_from_args(args: argparse.Namespace, algorithms):
    """The task ``args`` name (``add_task_arguments``) with the plans of ``algorithms`` and the
    shipped models, its header printed. Returns (models, tables, memory, plans)."""
    logging.disable(logging.WARNING)
    models = load_cost_models(None)
    tables, memory, plans = task_plans(args.family, args.devices, args.seed, algorithms, models)
    print(f"# {args.family}, {args.devices} devices, seed {args.seed}, {len(tables)} tables ({cpu_model()})")
    return models, tables, memory, plans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap, seed=167)
    ap.add_argument("--algorithms", nargs="+", default=["neuroshard", "random", "dim"])
    ap.add_argument("--measure", action="store_true")
    args = ap.parse_args()
    models, tables, _, plans = task_from_args(args, args.algorithms)
    measured = {}
    if args.measure:
        measured = {p.name: p.compute_ms for p in measure_plans(plans, tables, cost_models=models).plans}
    for name, plan in plans.items():
        print(name)
        for d in range(args.devices):
            shards = plan.shards_on(d)
            capped = sum(min(s.num_rows, DEFAULT_MAX_ROWS) * s.num_cols * 4 for s in shards) / 2**20
            full = sum(s.num_rows * s.num_cols * 4 for s in shards) / 2**30
            lookups = sum(tables[s.table].pooling_factor * s.num_cols * s.num_rows / tables[s.table].num_embeddings
                          for s in shards)
            big = sum(1 for s in shards if s.num_rows > DEFAULT_MAX_ROWS)
            est = (plan.estimate or {}).get("per_device_compute_ms")
            ms = f"   estimated {est[d]:6.1f} ms" if est else ""
            ms += f"   measured {measured[name][d]:6.1f} ms" if measured else ""
            print(f"  device {d}: {len(shards):3d} shards, {big:2d} over {DEFAULT_MAX_ROWS:,} rows, capped {capped:6.0f} "
                  f"MiB, full {full:5.1f} GiB, lookups x columns {lookups:7.0f}{ms}")


if __name__ == "__main__":
    main()
