"""Does ``neuroshard measure`` (devices timed one at a time) agree with the training runtime?

    python experiments/measure_vs_runtime.py                  # 4 tasks, 2 devices (about 5 min)
    python experiments/measure_vs_runtime.py --tasks 2 --family broad

On 2-device tasks (``families.family_tasks``), three plans per task (NeuroShard, size,
lookup) are measured twice: by ``measure_plans`` (each device's fused kernel alone on one
pinned thread, cache flushed before every run) and by the training runtime
(``runtime.evaluate.measure_alternating``: 2 gloo processes, the plans' steps interleaved,
compute on the thread clock). Both at the cost models' batch size. Printed per task and
plan: each device's compute by both, their difference (runtime / measure - 1), whether
both name the same slowest device, and whether both order the task's plans alike by
their slowest device. Written to ``--out`` as ``measure_vs_runtime.csv`` and ``.md``.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from common import write_source
from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.runtime.evaluate import measure_alternating
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import search_plan

ALGORITHMS = ("neuroshard", "size", "lookup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="dlrm-2021", choices=sorted(FAMILIES))
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[6, 12])
    parser.add_argument("--runs", type=int, default=3, help="timed passes and runtime runs of both instruments (default: 3)")
    parser.add_argument("--iterations", type=int, default=8, help="runtime steps per plan and round (default: 8)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="experiments/results/measure_vs_runtime")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    models = load_cost_models()
    rows, orders = [], []
    for i, (tables, memory) in enumerate(family_tasks(args.family, 2, args.tasks, tuple(args.tables_per_device),
                                                      seed=args.seed)):
        tables = tables.at_batch(models.batch_size)
        plans = {a: search_plan(tables, devices=2, memory=memory, algorithm=a, cost_models=models) for a in ALGORITHMS}
        alone = measure_plans(plans, tables, cost_models=models, passes=args.runs, repeats=1)
        runtime = measure_alternating(plans, tables, runs=args.runs, iterations=args.iterations, devices=2)
        for name in ALGORITHMS:
            a = alone[name].compute_ms
            r = [float(np.median([m.per_device[d]["compute_ms"] for m in runtime[name]])) for d in range(2)]
            for d in range(2):
                rows.append({"task": i, "tables": len(tables), "plan": name, "device": d, "measure_ms": a[d],
                             "runtime_ms": r[d], "difference": r[d] / a[d] - 1,
                             "same_slowest_device": int(np.argmax(a)) == int(np.argmax(r))})
            orders.append({"task": i, "plan": name, "measure_max": max(a), "runtime_max": max(r)})
    df = pd.DataFrame(rows)
    by_task = pd.DataFrame(orders)
    same_order = [list(g.sort_values("measure_max")["plan"]) == list(g.sort_values("runtime_max")["plan"])
                  for _, g in by_task.groupby("task")]
    best_same = [g.loc[g["measure_max"].idxmin(), "plan"] == g.loc[g["runtime_max"].idxmin(), "plan"]
                 for _, g in by_task.groupby("task")]
    summary = (f"per-device difference runtime / measure - 1: median {100 * df['difference'].median():+.1f}%, "
               f"mean |difference| {100 * df['difference'].abs().mean():.1f}%, "
               f"range {100 * df['difference'].min():+.1f}% to {100 * df['difference'].max():+.1f}%\n"
               f"same slowest device: {df.groupby(['task', 'plan'])['same_slowest_device'].first().mean():.0%} of plans; "
               f"same order of the {len(ALGORITHMS)} plans: {np.mean(same_order):.0%} of tasks; "
               f"same best plan: {np.mean(best_same):.0%} of tasks")
    text = df.round(3).to_string(index=False) + "\n\n" + summary
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_source(out)
    df.to_csv(out / "measure_vs_runtime.csv", index=False)
    (out / "measure_vs_runtime.md").write_text(
        f"# measure vs the training runtime ({args.family}, 2 devices, {args.tasks} tasks)\n\n"
        f"`python experiments/measure_vs_runtime.py --family {args.family} --tasks {args.tasks}`\n\n```\n{text}\n```\n")


if __name__ == "__main__":
    main()
