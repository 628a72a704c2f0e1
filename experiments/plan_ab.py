"""A/B of plan variants: each task's plans (and an A/A control) timed in ONE interleaved run.

A variant is ``ALGORITHM[:KEY=VALUE...]`` (search parameters as JSON values), e.g.
``neuroshard:split_margin=0``. Per task (``--families`` x ``--devices``, one task each,
``--tables-per-device`` per device, searched as one host), every variant's plan and
the first variant's plan again (A/A) are measured device by device (``measure_plans``,
``neuroshard measure``'s protocol). Printed per task: each plan's slowest device, total
compute and balance over the LAST variant's (the reference), and the geometric means.

    python experiments/plan_ab.py --families criteo-terabyte criteo-kaggle dlrm-2021 --devices 4 8 \\
        --variants neuroshard neuroshard:split_margin=0 measured-greedy --seed 41
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import shard
from neuroshard.topology import Topology


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["criteo-terabyte", "criteo-kaggle", "dlrm-2021"],
                        choices=sorted(FAMILIES))
    parser.add_argument("--devices", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--variants", nargs="+", default=["neuroshard", "neuroshard:split_margin=0", "measured-greedy"])
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[10, 30])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=41)
    args = parser.parse_args()
    models = load_cost_models()
    ratios = {v: [] for v in args.variants}
    totals = {v: [] for v in args.variants}
    print(f"machine: {cpu_model()}; reference: {args.variants[-1]}")
    for family in args.families:
        for devices in args.devices:
            tables, memory = family_tasks(family, devices, 1, tuple(args.tables_per_device), seed=args.seed)[0]
            tables = tables.at_batch(models.batch_size)
            plans = {}
            for variant in args.variants:
                algorithm, *pairs = variant.split(":")
                params = {k: json.loads(v) for k, v in (p.split("=", 1) for p in pairs)}
                plans[variant] = shard(tables, devices, memory, algorithm=algorithm, cost_models=models,
                                       topology=Topology(devices, local_world_size=devices), **params)
            plans["A/A"] = plans[args.variants[0]]
            measured = measure_plans(plans, tables, cost_models=models, passes=args.passes)
            ref = measured[args.variants[-1]]
            line = f"{family} D={devices}"
            for name in [*args.variants, "A/A"]:
                m = measured[name]
                ratio, total = m.max_compute_ms / ref.max_compute_ms, sum(m.compute_ms) / sum(ref.compute_ms)
                line += f" | {name}: {ratio:.3f} total {total:.3f} balance {m.balance:.3f}"
                if name in ratios:
                    ratios[name].append(ratio)
                    totals[name].append(total)
            print(line, flush=True)
    for name in args.variants:
        print(f"{name}: geometric mean {np.exp(np.mean(np.log(ratios[name]))):.3f}, worst {max(ratios[name]):.3f}, "
              f"total {np.exp(np.mean(np.log(totals[name]))):.3f}")


if __name__ == "__main__":
    main()
