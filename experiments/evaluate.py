"""The paper's comparison, measured: every algorithm on benchmark tasks of held-out tables.

    python experiments/evaluate.py                       # the defaults below (about 20-30 min here)
    python experiments/evaluate.py --tasks 3 --measure 1 # a quick look

Tasks: ``--tasks`` per device count, each ``--tables-per-task`` (10-60) tables at augmented widths drawn from
the held-out tables of the calibrated ``dlrm-2021`` benchmark
(``neuroshard.datasets.augment.benchmark_tables``: the cost data is collected on the
other tables), filling at most 70% of ``--devices`` x ``--memory``. Plans are searched
at the cost models' batch size so predicted and measured costs compare directly.

For every task and algorithm it records the simulated cost (the cost models'
prediction of the slowest device), the planning time and whether it returned a valid
plan (``valid_plan_share``: TorchRec's planner counts optimizer state in memory and
finds no plan for some tasks; ratios are over the tasks with a plan).
For the first ``--measure`` tasks of each device count in ``--measure-devices`` it runs
NeuroShard's plan and the task's best baseline on the training runtime
(``neuroshard.runtime.evaluate``: gloo processes on this machine) and records what
each device really spent. Each of ``--runs`` runs holds both plans and
alternates their steps (A B A B ..., ``neuroshard.runtime.evaluate.measure_alternating``),
so the slow spells of a shared machine, seconds long, hit both plans alike; each
round gives a ratio of the two plans' measured costs, and the measured improvement
of a task is one minus the geometric mean of its runs' ratios.

Measured device counts default to 2 because a device of the runtime is a process
running one thread: on this 2-core machine only 2 of them run truly in parallel.
With more processes than cores they time-share the cores, and a plan's measured
cost then follows the *total* work of all devices rather than its slowest device,
which is not what a plan for D parallel devices is judged by. On a machine with
more cores (or GPUs) pass ``--measure-devices 4 8``.

Writes under ``--out`` (default experiments/results/): ``plans.csv`` (one row per task
and algorithm), ``measured.csv`` (one row per measured plan and device),
``summary.md`` (the tables printed here) and three figures: ``cost_by_algorithm.png``,
``per_device_breakdown.png``, ``predicted_vs_measured.png``.
"""
from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.augment import benchmark_tables, sample_tasks
from neuroshard.errors import NeuroShardError
from neuroshard.search import shard
from neuroshard.search.registry import GREEDY_ALGORITHMS, SIMULATED_ALGORITHMS
from neuroshard.torchrec.guard import torchrec_available
from neuroshard.units import parse_bytes

log = logging.getLogger("evaluate")

ALGORITHMS = SIMULATED_ALGORITHMS  # every registered algorithm that needs no kernel timing


def search_all(args: argparse.Namespace, models) -> tuple[pd.DataFrame, dict]:
    """Plan every task with every algorithm: (one row per task x algorithm, the plans)."""
    _, held_out = benchmark_tables("dlrm-2021")
    held_out.batch_size = models.batch_size
    algorithms = [a for a in args.algorithms if a != "torchrec" or torchrec_available()]
    rows, plans = [], {}
    for devices in args.devices:
        tasks = sample_tasks(held_out, args.tasks, num_tables=tuple(args.tables_per_task), num_devices=devices,
                             device_memory_bytes=parse_bytes(args.memory), seed=args.seed + devices)
        for i, task in enumerate(tqdm(tasks, desc=f"search, {devices} devices")):
            task.tables.name = f"d{devices}-task{i}"
            for algorithm in algorithms:
                start = time.perf_counter()
                try:
                    plan = shard(task.tables, devices=devices, memory=task.device_memory_bytes,
                                 algorithm=algorithm, cost_models=models, seed=args.seed)
                    cost, valid = plan.estimate["max_device_cost_ms"], not plan.problems()
                    plans[(devices, i, algorithm)] = (plan, task)
                except NeuroShardError as exc:  # e.g. TorchRec's planner finds no plan
                    log.info("%s on %s: %s", algorithm, task.tables.name, exc)
                    cost, valid = math.nan, False
                rows.append({"devices": devices, "task": i, "tables": len(task.tables), "algorithm": algorithm,
                             "simulated_ms": cost, "planning_s": time.perf_counter() - start, "valid": valid})
    df = pd.DataFrame(rows)
    best = (df[df.algorithm.isin(GREEDY_ALGORITHMS)].groupby(["devices", "task"]).simulated_ms.min()
            .rename("best_baseline_ms"))
    df = df.join(best, on=["devices", "task"])
    df["ratio_to_best_baseline"] = df.simulated_ms / df.best_baseline_ms
    return df, plans


def measure_some(args: argparse.Namespace, df: pd.DataFrame, plans: dict) -> pd.DataFrame:
    """Run NeuroShard's plan and the best baseline's on the runtime for a few tasks:
    ``--runs`` runs, each alternating the plans' steps (with ``--control``, the
    baseline's plan a second time as an A/A control); one row per round, plan and
    device."""
    from neuroshard.runtime.evaluate import measure_alternating
    rows = []
    for devices in args.measure_devices:
        for i in range(min(args.measure, args.tasks)):
            here = df[(df.devices == devices) & (df.task == i)]
            if here.empty:
                continue
            baselines = here[here.algorithm.isin(GREEDY_ALGORITHMS)].dropna(subset=["simulated_ms"])
            best = baselines.loc[baselines.simulated_ms.idxmin(), "algorithm"]
            pair = {a: plans[(devices, i, a)][0] for a in ("neuroshard", best) if (devices, i, a) in plans}
            task = plans[(devices, i, best)][1]
            if args.control:  # A/A: the baseline's plan once more, measured like the others
                pair["control"] = pair[best]
            log.warning("measuring neuroshard and %s on d%d-task%d (%d tables), %d runs", best, devices, i,
                        len(task.tables), args.runs)
            results = measure_alternating(pair, task.tables, runs=args.runs, iterations=args.iterations,
                                          devices=devices, batch_size=task.tables.batch_size)
            for algorithm, measurements in results.items():
                est = pair[algorithm].estimate
                for round_, result in enumerate(measurements):
                    for d, measured in enumerate(result.per_device):
                        rows.append({"devices": devices, "task": i, "round": round_, "algorithm": algorithm,
                                     "role": algorithm if algorithm in ("neuroshard", "control") else "best_baseline",
                                     "device": d,
                                     "predicted_compute_ms": est["per_device_compute_ms"][d],
                                     "predicted_fwd_comm_ms": est["per_device_fwd_comm_ms"][d],
                                     "predicted_bwd_comm_ms": est["per_device_bwd_comm_ms"][d],
                                     "predicted_total_ms": est["per_device_cost_ms"][d],
                                     "measured_compute_ms": measured["compute_ms"],
                                     "measured_fwd_comm_ms": measured["fwd_comm_ms"],
                                     "measured_bwd_comm_ms": measured["bwd_comm_ms"],
                                     "measured_total_ms": measured["total_ms"]})
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame, measured: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per algorithm and device count: mean simulated cost, ratio to the best baseline
    (mean, worst), planning time, validity; and per measured task the measured costs."""
    table = df.groupby(["devices", "algorithm"], sort=False).agg(
        tasks=("task", "count"), mean_simulated_ms=("simulated_ms", "mean"),
        mean_ratio=("ratio_to_best_baseline", "mean"), worst_ratio=("ratio_to_best_baseline", "max"),
        planning_s=("planning_s", "mean"), valid_plan_share=("valid", "mean")).reset_index()
    table["improvement_vs_best_baseline_%"] = 100.0 * (1.0 - table.mean_ratio)
    if measured.empty:
        return table, measured
    # a plan's cost is its slowest device, per run; the measured figure is the median over runs
    per_round = measured.groupby(["devices", "task", "algorithm", "role", "round"]).agg(
        predicted_ms=("predicted_total_ms", "max"), measured_ms=("measured_total_ms", "max")).reset_index()
    per_plan = per_round.groupby(["devices", "task", "algorithm", "role"]).agg(
        predicted_ms=("predicted_ms", "first"), measured_ms=("measured_ms", "median"),
        measured_spread=("measured_ms", lambda x: (x.max() - x.min()) / x.median())).reset_index()
    per_plan["model_error_%"] = 100.0 * (per_plan.predicted_ms - per_plan.measured_ms).abs() / per_plan.measured_ms
    return table, per_plan


def measured_summary(measured: pd.DataFrame, per_plan: pd.DataFrame) -> pd.DataFrame:
    """NeuroShard against the best baseline on measured cost, per measured task: the
    median costs over runs, and the improvement from the runs' paired ratios
    (NeuroShard's cost over the baseline's measured just before or after it)."""
    from neuroshard.runtime.evaluate import paired_improvement
    wide = per_plan.pivot_table(index=["devices", "task"], columns="role", values="measured_ms").dropna()
    per_round = (measured.groupby(["devices", "task", "round", "role"]).measured_total_ms.max()
                 .unstack("role").dropna())

    def against_baseline(role: str) -> pd.DataFrame:
        """Per task: the paired improvement of ``role`` over the baseline, and its best and worst round."""
        return per_round.groupby(["devices", "task"]).apply(lambda r: pd.Series({
            "improvement": paired_improvement(r[role], r["best_baseline"]),
            "best": 1.0 - (r[role] / r["best_baseline"]).min(),
            "worst": 1.0 - (r[role] / r["best_baseline"]).max()}))

    ours = 100.0 * against_baseline("neuroshard")
    wide["measured_improvement_%"] = ours["improvement"]
    wide["best_round_%"] = ours["best"]
    wide["worst_round_%"] = ours["worst"]
    if "control" in per_round:  # the same measurement of the baseline's plan against itself
        wide["control_%"] = 100.0 * against_baseline("control")["improvement"]
    return wide.drop(columns="control", errors="ignore").reset_index()


def plot(table: pd.DataFrame, measured: pd.DataFrame, per_plan: pd.DataFrame, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    paths: list[Path] = []

    def save(fig, name: str, rect=None) -> None:
        fig.tight_layout(rect=rect)
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.6))
    device_counts = sorted(table.devices.unique())
    algorithms = list(dict.fromkeys(table.algorithm))
    width = 0.8 / len(device_counts)
    for k, devices in enumerate(device_counts):
        part = table[table.devices == devices].set_index("algorithm").reindex(algorithms)
        ax.bar(np.arange(len(algorithms)) + k * width, part.mean_ratio, width, label=f"{devices} devices")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(algorithms)) + width * (len(device_counts) - 1) / 2, algorithms, rotation=20)
    ax.set_ylabel("simulated cost / best baseline")
    ax.set_title("Plan cost by algorithm (mean over tasks; lower is better)")
    ax.legend()
    save(fig, "cost_by_algorithm.png")

    if measured.empty:
        return paths
    first = measured[(measured.devices == measured.devices.iloc[0]) & (measured.task == measured.task.iloc[0])
                     & (measured["round"] == 0)]
    fig, axes = plt.subplots(1, first.algorithm.nunique(), figsize=(10, 3.8), sharey=True, squeeze=False)
    for ax, (algorithm, part) in zip(axes[0], first.groupby("algorithm", sort=False)):
        x = np.arange(len(part))
        for offset, kind in ((-0.2, "predicted"), (0.2, "measured")):
            bottom = np.zeros(len(part))
            for phase, color in (("compute", "C0"), ("fwd_comm", "C1"), ("bwd_comm", "C2")):
                values = part[f"{kind}_{phase}_ms"].to_numpy()
                ax.bar(x + offset, values, 0.38, bottom=bottom, color=color, alpha=0.55 if kind == "predicted" else 1,
                       label=f"{phase} ({kind})")
                bottom += values
        ax.set_title(f"{algorithm} (left bars predicted, right measured)", fontsize=9)
        ax.set_xticks(x)
        ax.set_xlabel("device")
    axes[0][0].set_ylabel("ms per iteration")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7)
    save(fig, "per_device_breakdown.png", rect=(0, 0.08, 1, 1))

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for role, part in per_plan.groupby("role"):
        ax.scatter(part.measured_ms, part.predicted_ms, label=role, s=18)
    low = min(per_plan.measured_ms.min(), per_plan.predicted_ms.min()) * 0.8
    high = max(per_plan.measured_ms.max(), per_plan.predicted_ms.max()) * 1.25
    ax.plot([low, high], [low, high], color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured max device cost (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title("Predicted vs measured plan cost")
    ax.legend()
    save(fig, "predicted_vs_measured.png")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20, help="tasks per device count (default 20)")
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--memory", default="1GiB", help="memory per device (default 1GiB)")
    parser.add_argument("--tables-per-task", type=int, nargs=2, default=[10, 60], metavar=("MIN", "MAX"),
                        help="tables per task (default 10 60)")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--measure", type=int, default=10, help="tasks per device count run on the runtime")
    parser.add_argument("--measure-devices", type=int, nargs="*", default=[2],
                        help="device counts whose plans are measured (default 2: one process per core here)")
    parser.add_argument("--iterations", type=int, default=20, help="measured iterations per plan and round")
    parser.add_argument("--runs", type=int, default=3, help="measurement runs per task, each alternating both plans")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the A/A control (by default each measured run also holds the baseline's plan "
                             "a second time, which shows the measurement's own noise)")
    parser.add_argument("--cost-model", default=None, help="cost-model checkpoint (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    pd.set_option("display.width", 200)

    models = load_cost_models(args.cost_model)
    print(f"cost models: {models.name}, measured at batch {models.batch_size} on "
          f"{models.hardware.get('hardware', {}).get('cpu_model', 'unknown hardware')}")
    df, plans = search_all(args, models)
    measured = measure_some(args, df, plans) if args.measure > 0 and args.measure_devices else pd.DataFrame()
    table, per_plan = summarize(df, measured)

    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "plans.csv", index=False)
    fmt = lambda x: f"{x:.3f}"  # noqa: E731
    lines = ["# NeuroShard evaluation\n",
             f"Command: `python experiments/evaluate.py {' '.join(argv or [])}`".rstrip() + "  ",
             f"Cost models: `{models.name}` (batch {models.batch_size}). Tasks: {args.tasks} per device count, "
             f"{args.tables_per_task[0]}-{args.tables_per_task[1]} held-out dlrm-2021 tables, {args.memory} per device.\n",
             "## Simulated cost per algorithm (ratio to the best of the five greedy baselines per task)\n",
             markdown(table)]
    print("\nSimulated cost per algorithm (ratio = cost / best greedy baseline of the same task):")
    print(table.to_string(index=False, float_format=fmt))
    if not measured.empty:
        measured.to_csv(args.out / "measured.csv", index=False)
        wins = measured_summary(measured, per_plan)
        print("\nMeasured on the runtime (max device cost, ms):")
        print(wins.to_string(index=False, float_format=fmt))
        verdict = (f"{wins['measured_improvement_%'].mean():+.1f}% (worst task {wins['measured_improvement_%'].min():+.1f}%, "
                   f"better on {int((wins['measured_improvement_%'] > 0).sum())} of {len(wins)} tasks)")
        if "control_%" in wins:
            verdict += (f"; the A/A control (the baseline's plan against itself) gives {wins['control_%'].mean():+.1f}% "
                        f"on average, {wins['control_%'].abs().mean():.1f}% in absolute value per task")
        print(f"mean measured improvement of NeuroShard over the best baseline: {verdict}")
        spread = f"{100 * per_plan.measured_spread.median():.1f}%"
        print(f"run-to-run spread of one plan's measured cost (max-min over median of {args.runs} runs), "
              f"median over plans: {spread}")
        print("\nCost-model error on the chosen plans (max device cost):")
        errors = per_plan.groupby("role")["model_error_%"].agg(["mean", "max"])
        print(errors.to_string(float_format=fmt))
        lines += ["\n## Measured on the runtime (max device cost, ms)\n",
                  markdown(wins),
                  f"\nMean measured improvement of NeuroShard over the best baseline: {verdict}. "
                  f"Per task: one minus the geometric mean of the cost ratios of {args.runs} runs (runs that "
                  f"alternate the two plans' steps, {args.iterations} measured steps each, median per device); "
                  f"the columns neuroshard and "
                  f"best_baseline are medians over runs, whose run-to-run spread (max-min over median) is "
                  f"{spread} for the median plan\n",
                  "## Cost-model error on the chosen plans (% of measured max device cost)\n",
                  markdown(errors.reset_index())]
    figures = plot(table, measured, per_plan, args.out)
    lines += ["\n## Figures\n"] + [f"![{p.stem}]({p.name})" for p in figures]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"\nwrote {args.out / 'summary.md'}, CSVs and {len(figures)} figures in {args.out}")
    return 0


def markdown(df: pd.DataFrame) -> str:
    """A markdown table (floats to 3 decimals)."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in df.itertuples(index=False)]
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


if __name__ == "__main__":
    raise SystemExit(main())
