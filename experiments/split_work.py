"""What splitting a hot table costs in total work (issue 25, item 1): the same table whole,
in two column halves, in two row halves and in four row blocks, on two devices beside the
same other tables, timed device by device with ``neuroshard measure``'s protocol in one
interleaved run.

    python experiments/split_work.py --family criteo-terabyte --devices 4 --task 0 --tables t21 t22 t27 --calibrate
    python experiments/split_work.py --family dlrm-2021 --devices 8 --seed 153 --tables t67 t57 t39 t44 --calibrate

For each table named, five two-device plans are timed together: device 0 holds three of the
task's other hottest tables, device 1 three more, and the table goes whole on device 0, or
its column halves (each half does every lookup, at half the width), or its row halves (each
does the lookups that fall in its rows), one on each device, or its four row blocks, two on
each device (does the number of blocks cost?), or its four column quarters, two on each device
(what splitting a narrow table for memory made before ``MIN_COLUMN_SHARD_DIM``), or whole again
(the A/A control). The total
work of a plan is the sum of its two devices. With ``--calibrate`` each layout's total is
also predicted by the pre-trained cost models and by the models calibrated on the task
(``measured.calibrate``, as ``search --calibrate`` does): does the model see what a split
costs? The task is ``datasets.families.family_tasks``'s (seed 53 by default, 8-12 tables per
device), as in ``plan_benchmark.py``.
"""
from __future__ import annotations

import argparse
import sys

from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.datasets.families import family_tasks
from neuroshard.measured.calibrate import calibrate
from neuroshard.plan import Plan, Shard
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.simulator import Simulator
from neuroshard.tables import TableSet


def layouts(name: str, tables: TableSet, fillers: tuple[list[str], list[str]]) -> dict[str, list[Shard]]:
    """The table ``name`` whole, in column halves, row halves, row quarters and (widths that allow them)
    column quarters beside the ``fillers``."""
    t = tables[name]
    whole = [Shard(n, 0, tables[n].num_embeddings, 0, tables[n].embedding_dim, d)
             for d, names in enumerate(fillers) for n in names]
    rows, cols, quarter = (t.num_embeddings + 1) // 2, t.embedding_dim // 2, -(-t.num_embeddings // 4)
    return {"whole": whole + [Shard(name, 0, t.num_embeddings, 0, t.embedding_dim, 0)],
            "column halves": whole + [Shard(name, 0, t.num_embeddings, 0, cols, 0),
                                      Shard(name, 0, t.num_embeddings, cols, t.embedding_dim - cols, 1)],
            "row halves": whole + [Shard(name, 0, rows, 0, t.embedding_dim, 0),
                                   Shard(name, rows, t.num_embeddings - rows, 0, t.embedding_dim, 1)],
            "row quarters": whole + [Shard(name, q * quarter, min(quarter, t.num_embeddings - q * quarter), 0,
                                           t.embedding_dim, q % 2) for q in range(4)],
            **({"column quarters": whole + [Shard(name, 0, t.num_embeddings, q * (cols // 2), cols // 2, q // 2)
                                            for q in range(4)]} if t.embedding_dim % 16 == 0 else {}),
            "whole again": whole + [Shard(name, 0, t.num_embeddings, 0, t.embedding_dim, 0)]}


def predicted(plan: Plan, tables: TableSet, models) -> float:
    """The total of ``plan``'s devices as ``models`` predict it (ms)."""
    return float(Simulator.from_plan(plan, models, tables, models.batch_size).evaluate_plan(plan).compute_ms[0].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="criteo-terabyte")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--task", type=int, default=0)
    ap.add_argument("--seed", type=int, default=53)
    ap.add_argument("--tables", nargs="+", required=True, help="the hot tables to split, one at a time")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calibrate", action="store_true", help="also print the pre-trained and calibrated predictions")
    args = ap.parse_args()
    models = load_cost_models(None)
    tables, _ = family_tasks(args.family, args.devices, args.task + 1, (8, 12), seed=args.seed)[args.task]
    print(f"# python experiments/split_work.py {' '.join(sys.argv[1:])}   ({cpu_model()}, batch {models.batch_size})")
    predictors = {}
    if args.calibrate:
        calibrated, report = calibrate(tables, models, devices=args.devices, seed=args.task)
        predictors = {"pre-trained": models, "calibrated": calibrated}
        print(f"# {report.format()}")
    for name in args.tables:
        t = tables[name]
        others = [u.name for u in sorted(tables, key=lambda u: u.pooling_factor) if u.name not in args.tables][-6:]
        sub = TableSet(f"{name}-and-6", [t] + [tables[n] for n in others], tables.batch_size)
        plans = {k: Plan(tables=list(sub), shards=v, num_devices=2, device_memory_bytes=2**40)
                 for k, v in layouts(name, sub, (others[:3], others[3:])).items()}
        result = measure_plans(plans, sub, cost_models=models, passes=args.passes, repeats=args.repeats)
        whole = sum(next(p for p in result.plans if p.name == "whole").compute_ms)
        print(f"{name}: {t.num_embeddings:,} rows, dim {t.embedding_dim}, pooling {t.pooling_factor:g}")
        for p in result.plans:
            total = sum(p.compute_ms)
            guesses = "".join(f"; {label} {predicted(p.plan, sub, m):7.2f}" for label, m in predictors.items())
            print(f"  {p.name:14s} devices {', '.join(f'{x:6.2f}' for x in p.compute_ms)} ms   total {total:7.2f} ms "
                  f"({total - whole:+6.2f} against whole){guesses}")


if __name__ == "__main__":
    main()
