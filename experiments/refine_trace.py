"""Why did ``--refine`` keep a plan 10% slower than measured-greedy's? One task, traced.

Session 20's 8-device benchmark (experiments/results/plan_benchmark_issue25_session19_8dev,
criteo-terabyte task 1, seed 139, one host) measured refine's plan (it kept lookup's) 1.106x
measured-greedy's, though refine times measured-greedy's plan among its candidates. This
script runs that task's calibration and refine again with every plan refine makes recorded
(its ``shard`` calls are observed, not changed), then times, in one interleaved run, refine's
plan, the measured-greedy plan refine compared, a fresh measured-greedy plan (measured-greedy
times tables alone; its plan can differ between runs), lookup's, and a copy of the first
(A/A). It prints refine's own record (every compared plan's measured cost) and the run.

    python experiments/refine_trace.py [--family criteo-terabyte --devices 8 --task 1 --seed 139]
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.measured import refine as refine_module
from neuroshard.measured.calibrate import start_calibration
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import shard
from neuroshard.tables import TableSet
from neuroshard.topology import Topology


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that name one task of ``plan_benchmark`` (default: session 20's loss,
    criteo-terabyte task 1 of seed 139 at 8 devices); ``benchmark_task`` draws it. Shared
    with copy_noise.py and order_aa.py, which time this task's plans."""
    parser.add_argument("--family", default="criteo-terabyte", choices=sorted(FAMILIES))
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--task", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=2, help="tasks the benchmark drew (the task's seed depends on it)")
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[8, 12])
    parser.add_argument("--seed", type=int, default=139)


def benchmark_task(args: argparse.Namespace) -> tuple[TableSet, int]:
    """The (tables, memory per device) of the task ``add_task_arguments`` named."""
    return family_tasks(args.family, args.devices, args.tasks, tuple(args.tables_per_device),
                        seed=args.seed)[args.task]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(parser)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default="experiments/results/refine_trace",
                        help="the plans are written here (the A/A copy is the refined plan)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("neuroshard").setLevel(logging.INFO)  # refine's rounds, comparison and polish steps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = load_cost_models(None)
    tables, memory = benchmark_task(args)
    network = {"topology": Topology(args.devices, local_world_size=args.devices)}
    made = []  # every plan refine's shard calls return, with the algorithm that made it
    original = refine_module.shard

    def observed(*a, **k):
        plan = original(*a, **k)
        made.append((k.get("algorithm", "neuroshard"), plan))
        return plan

    refine_module.shard = observed
    start = time.perf_counter()
    calibration = start_calibration(tables, models, devices=args.devices, sets=120, seed=args.task)
    calibrated, report = calibration.fit()
    print(report.format())
    chosen = refine_module.refine(tables, args.devices, memory, calibration, args.rounds, models=calibrated,
                                  seed=args.task, **network)
    refine_module.shard = original
    print(f"refine took {time.perf_counter() - start:.0f} s")
    record = chosen.provenance["refine"]
    print(json.dumps({k: record[k] for k in ("chosen", "rounds", "compared")}, indent=1))
    print("polish:", json.dumps(record.get("polish", {}))[:600])
    inner = {a: p for a, p in made}
    fresh = shard(tables, devices=args.devices, memory=memory, algorithm="measured-greedy", cost_models=models,
                  seed=args.task, **network)
    plans = {"refined": chosen, "refine's measured-greedy": inner["measured-greedy"], "fresh measured-greedy": fresh,
             "lookup": inner.get("lookup") or shard(tables, devices=args.devices, memory=memory, algorithm="lookup",
                                                    cost_models=models, seed=args.task, **network),
             "refined (A/A copy)": chosen}
    print("refine's measured-greedy plan == fresh measured-greedy plan:",
          inner["measured-greedy"].layout_key() == fresh.layout_key())
    for name, plan in plans.items():
        if "A/A" in name:
            continue
        plan.write(out / (name.replace(" ", "_").replace("'", "").replace("(", "").replace(")", "")
                          .replace("/", "") + ".json"))
    result = measure_plans(plans, tables, cost_models=models, progress=True)
    base = result.plans[0].max_compute_ms
    for p in result.plans:
        print(f"{p.name:26s} max {p.max_compute_ms:8.2f} ms  total {sum(p.compute_ms):8.2f} ms  "
              f"{p.max_compute_ms / base:.3f}x refined  devices {[round(x, 1) for x in p.compute_ms]}")


if __name__ == "__main__":
    main()
