"""Search benchmark: simulated plan cost of every algorithm against the best greedy
baseline, and how NeuroShard's search time grows with tables x devices.

    python experiments/search_benchmark.py                      # defaults below
    python experiments/search_benchmark.py --tasks 4 --scaling 100x8 --no-torchrec

Tasks: ``--tasks`` per device count, each 10-60 tables at augmented widths (4-128)
drawn from the held-out tables of the synthetic ``dlrm-2021`` benchmark
(``neuroshard.datasets.augment.sample_tasks``), filling at most ``--fill`` of
``--devices`` x ``--memory``. Costs are the
simulator's (the cost models' predictions), so this measures search quality against
the models, not on hardware (``neuroshard.runtime`` measures plans for real).

Prints two tables (and writes them as CSV with ``--out``):
1. per algorithm and device count: mean and worst cost / best greedy baseline of the
   same task (1.0 = as good as the best of random/size/dim/lookup/size-lookup), mean
   search time, tasks where it found no plan;
2. scaling: NeuroShard's search time (and cost vs the best greedy) for tables x devices.
"""
from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from neuroshard.constraints import check_capacity
from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.augment import benchmark_tables, sample_tasks
from neuroshard.datasets.synthetic import generate
from neuroshard.errors import NeuroShardError
from neuroshard.search import Simulator, search_placement
from neuroshard.search.registry import GREEDY_ALGORITHMS, SIMULATED_ALGORITHMS
from neuroshard.tables import TableSet
from neuroshard.torchrec.guard import torchrec_available
from neuroshard.units import parse_bytes

log = logging.getLogger("search_benchmark")

ALGORITHMS = SIMULATED_ALGORITHMS  # every registered algorithm that needs no kernel timing


def benchmark_tasks(num_tasks: int, devices: int, args: argparse.Namespace, seed: int) -> list[tuple[TableSet, int]]:
    """(tables, per-device memory) of random tasks over the held-out tables of the synthetic
    dlrm-2021 benchmark (augmented widths, at most ``--fill`` of all memory)."""
    _, held_out = benchmark_tables("dlrm-2021")
    tasks = sample_tasks(held_out, num_tasks, num_tables=(args.min_tables, args.max_tables), num_devices=devices,
                         device_memory_bytes=parse_bytes(args.memory), seed=seed, max_fill=args.fill)
    return [(task.tables, task.device_memory_bytes) for task in tasks]


def memory_for(tables: TableSet, devices: int, fill: float) -> int:
    """Per-device memory at which the tables fill ``fill`` of all devices."""
    return int(math.ceil(tables.total_bytes() / (fill * devices)))


def run_quality(args: argparse.Namespace, models) -> pd.DataFrame:
    algorithms = [a for a in args.algorithms if a != "torchrec" or torchrec_available()]
    if len(algorithms) < len(args.algorithms):
        log.warning("torchrec is not importable: its baseline is skipped")
    rows = []
    for devices in args.devices:
        tasks = benchmark_tasks(args.tasks, devices, args, seed=args.seed + devices)
        for task, memory in tqdm(tasks, desc=f"{devices} devices", disable=args.quiet):
            check_capacity(task, devices, memory, 4)
            sim = Simulator(task, devices, models)
            for algorithm in algorithms:
                start = time.perf_counter()
                try:
                    cost = search_placement(sim, memory, algorithm, seed=args.seed).cost_ms
                except NeuroShardError as exc:  # e.g. TorchRec counts optimizer state and finds no plan
                    log.info("%s on %s: %s", algorithm, task.name, exc)
                    cost = math.nan
                rows.append({"devices": devices, "task": task.name, "tables": len(task), "algorithm": algorithm,
                             "cost_ms": cost, "time_s": time.perf_counter() - start})
    df = pd.DataFrame(rows)
    best = df[df.algorithm.isin(GREEDY_ALGORITHMS)].groupby(["devices", "task"]).cost_ms.min().rename("best_greedy_ms")
    df = df.join(best, on=["devices", "task"])
    df["ratio"] = df.cost_ms / df.best_greedy_ms
    return df


def summarize_quality(df: pd.DataFrame) -> pd.DataFrame:
    table = df.groupby(["algorithm", "devices"]).agg(
        mean_ratio=("ratio", "mean"), worst_ratio=("ratio", "max"), best_ratio=("ratio", "min"),
        mean_time_s=("time_s", "mean"), no_plan=("cost_ms", lambda c: int(c.isna().sum())))
    order = {a: i for i, a in enumerate(ALGORITHMS)}
    table = table.reset_index()
    table["rank"] = table.algorithm.map(order)
    return table.sort_values(["devices", "rank"]).drop(columns="rank")


def run_scaling(args: argparse.Namespace, models) -> pd.DataFrame:
    rows = []
    for size in args.scaling:
        num_tables, devices = (int(x) for x in size.lower().split("x"))
        tables = generate("dlrm-2021", num_tables, seed=args.seed)
        memory = memory_for(tables, devices, args.fill)
        sim = Simulator(tables, devices, models)  # fresh: feature and cost caches are part of the time
        start = time.perf_counter()
        ours = search_placement(sim, memory, "neuroshard")
        elapsed = time.perf_counter() - start
        start = time.perf_counter()
        greedy = {a: search_placement(sim, memory, a, seed=args.seed).cost_ms for a in GREEDY_ALGORITHMS}
        greedy_s = (time.perf_counter() - start) / len(GREEDY_ALGORITHMS)
        rows.append({"tables": num_tables, "devices": devices, "neuroshard_s": round(elapsed, 2),
                     "greedy_s": round(greedy_s, 3), "shards": len(ours.pieces),
                     "states": ours.details.get("states_evaluated"), "sets_costed": sim.sets_predicted,
                     "cost_vs_best_greedy": round(ours.cost_ms / min(greedy.values()), 4)})
        log.info("scaling %s: %.2f s", size, elapsed)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks per device count (default 8)")
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--min-tables", type=int, default=10)
    parser.add_argument("--max-tables", type=int, default=60)
    parser.add_argument("--memory", default="2GiB", help="memory per device of the quality tasks (default 2GiB)")
    parser.add_argument("--fill", type=float, default=0.7,
                        help="most of all device memory a task fills (scaling points: exactly this)")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--no-torchrec", action="store_true", help="leave TorchRec's planner out")
    parser.add_argument("--scaling", nargs="*", default=["10x4", "100x8", "200x16", "428x64", "856x128"],
                        metavar="TABLESxDEVICES", help="scaling points (none: skip)")
    parser.add_argument("--cost-model", default=None, help="cost-model checkpoint (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="folder for CSV results")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.no_torchrec:
        args.algorithms = [a for a in args.algorithms if a != "torchrec"]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    models = load_cost_models(args.cost_model)
    print(f"cost models: {models.name} (batch {models.batch_size}); tasks: {args.tasks} per device count, "
          f"{args.min_tables}-{args.max_tables} tables, {args.memory} per device, at most {args.fill:.0%} full")
    pd.set_option("display.width", 200)
    if args.tasks > 0:
        quality = run_quality(args, models)
        summary = summarize_quality(quality)
        print("\nSimulated cost relative to the best greedy baseline of each task (lower is better):")
        print(summary.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            quality.to_csv(args.out / "search_quality.csv", index=False)
    if args.scaling:
        scaling = run_scaling(args, models)
        print("\nNeuroShard search time by tables x devices (2-core CPU; targets: 100x8 < 2 s, 856x128 < 60 s):")
        print(scaling.to_string(index=False))
        if args.out:
            scaling.to_csv(args.out / "search_scaling.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
