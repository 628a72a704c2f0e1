"""Does ``neuroshard measure`` (devices timed one at a time) agree with the training runtime?

    python experiments/measure_vs_runtime.py                  # 4 tasks, 2 devices (about 5 min)
    python experiments/measure_vs_runtime.py --tasks 2 --family broad
    python experiments/measure_vs_runtime.py --family criteo-terabyte --devices 4 --refine-candidates

On tasks of ``--devices`` devices (``families.family_tasks``), a few plans per task (by default
NeuroShard's, size's and lookup's; ``--refine-candidates``: the plans refine's comparison times
first, the plain search's and the table-wise baselines', and a copy of the plain search's plan,
an A/A control of both instruments) are measured twice: by ``measure_plans`` (each device's fused
kernel alone on one pinned thread, cache flushed before every run: refine's instrument) and by the
training runtime (``runtime.evaluate.measure_alternating``: one gloo process per device, the plans'
steps interleaved, compute on the thread clock, warm from one step to the next). Both at the cost
models' batch size. Printed per task and plan: each device's compute by both, their difference
(runtime / measure - 1), whether both name the same slowest device; per task, whether both order
the plans alike, whether the plan ``measure`` finds fastest (refine's choice among them) is also
the runtime's fastest, and how much slower than the runtime's fastest it runs there. Written to
``--out`` as ``measure_vs_runtime.csv`` and ``.md``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from common import write_source
from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.measured.judge import geometric_mean
from neuroshard.runtime.evaluate import measure_alternating
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import search_plan
from neuroshard.topology import Topology

ALGORITHMS = ("neuroshard", "size", "lookup")
#: the plans refine times first (its comparison run: the plain search's and the table-wise baselines'),
#: and a copy of the plain search's plan (its A/A control)
REFINE_CANDIDATES = ("neuroshard", "lookup", "size-lookup", "dim")
COPY = "neuroshard (copy)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="dlrm-2021", choices=sorted(FAMILIES))
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[6, 12])
    parser.add_argument("--runs", type=int, default=3, help="timed passes and runtime runs of both instruments (default: 3)")
    parser.add_argument("--iterations", type=int, default=8, help="runtime steps per plan and round (default: 8)")
    parser.add_argument("--devices", type=int, default=2, help="devices per task (default: 2)")
    parser.add_argument("--refine-candidates", action="store_true",
                        help=f"compare {', '.join(REFINE_CANDIDATES)} and a copy of the first (an A/A control)")
    parser.add_argument("--one-host", action="store_true", help="plans for one host of --devices GPUs (NVLink exchange)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="experiments/results/measure_vs_runtime")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    models = load_cost_models()
    algorithms = REFINE_CANDIDATES if args.refine_candidates else ALGORITHMS
    devices = args.devices
    network = {"topology": Topology(devices, local_world_size=devices)} if args.one_host else {}  # as plan_benchmark's
    rows, orders = [], []
    for i, (tables, memory) in enumerate(family_tasks(args.family, devices, args.tasks, tuple(args.tables_per_device),
                                                      seed=args.seed)):
        tables = tables.at_batch(models.batch_size)
        plans = {a: search_plan(tables, devices=devices, memory=memory, algorithm=a, cost_models=models,
                                **network) for a in algorithms}
        if args.refine_candidates:
            plans[COPY] = plans[algorithms[0]]
        alone = measure_plans(plans, tables, cost_models=models, passes=args.runs, repeats=1)
        runtime = measure_alternating(plans, tables, runs=args.runs, iterations=args.iterations, devices=devices)
        for name in plans:
            a = alone[name].compute_ms
            r = [float(np.median([m.per_device[d]["compute_ms"] for m in runtime[name]])) for d in range(devices)]
            for d in range(devices):
                rows.append({"task": i, "tables": len(tables), "plan": name, "device": d, "measure_ms": a[d],
                             "runtime_ms": r[d], "difference": r[d] / a[d] - 1,
                             "same_slowest_device": int(np.argmax(a)) == int(np.argmax(r))})
            orders.append({"task": i, "plan": name, "measure_max": max(a), "runtime_max": max(r)})
    df = pd.DataFrame(rows)
    by_task = pd.DataFrame(orders)
    compared = by_task[by_task["plan"] != COPY]  # the copy is the A/A control, not a candidate
    same_order = [list(g.sort_values("measure_max")["plan"]) == list(g.sort_values("runtime_max")["plan"])
                  for _, g in compared.groupby("task")]
    best_same = [g.loc[g["measure_max"].idxmin(), "plan"] == g.loc[g["runtime_max"].idxmin(), "plan"]
                 for _, g in compared.groupby("task")]
    # on the runtime, the plan measure finds fastest over the runtime's fastest (1: the same plan)
    regret = [g.loc[g["measure_max"].idxmin(), "runtime_max"] / g["runtime_max"].min() for _, g in compared.groupby("task")]
    summary = (f"per-device difference runtime / measure - 1: median {100 * df['difference'].median():+.1f}%, "
               f"mean |difference| {100 * df['difference'].abs().mean():.1f}%, "
               f"range {100 * df['difference'].min():+.1f}% to {100 * df['difference'].max():+.1f}%\n"
               f"same slowest device: {df.groupby(['task', 'plan'])['same_slowest_device'].first().mean():.0%} of plans; "
               f"same order of the {len(algorithms)} plans: {np.mean(same_order):.0%} of tasks; "
               f"same best plan: {np.mean(best_same):.0%} of tasks; on the runtime, measure's fastest plan over "
               f"the runtime's fastest: {geometric_mean(regret):.3f} (geometric mean), worst {max(regret):.3f}")
    if args.refine_candidates:
        aa = [(g.loc[g["plan"] == COPY, kind].iloc[0] / g.loc[g["plan"] == algorithms[0], kind].iloc[0])
              for _, g in by_task.groupby("task") for kind in ("measure_max", "runtime_max")]
        summary += (f"\nA/A control (the copy over the plan, slowest device): measure mean |log| "
                    f"{100 * np.mean(np.abs(np.log(aa[0::2]))):.1f}%, runtime {100 * np.mean(np.abs(np.log(aa[1::2]))):.1f}%")
    summary += "\nper task, slowest device (ms), measure / runtime:\n" + by_task.round(3).to_string(index=False)
    text = df.round(3).to_string(index=False) + "\n\n" + summary
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_source(out)
    df.to_csv(out / "measure_vs_runtime.csv", index=False)
    (out / "measure_vs_runtime.md").write_text(
        f"# measure vs the training runtime ({args.family}, {devices} devices, {args.tasks} tasks)\n\n"
        f"`python experiments/measure_vs_runtime.py {' '.join(sys.argv[1:])}`\n\n```\n{text}\n```\n")


if __name__ == "__main__":
    main()
