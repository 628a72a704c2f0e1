"""Does trading compute for all-to-all bytes pay? Plans trained on real gloo processes (issue 25, item 4).

With the default network (no topology), the search costs the exchange with the
communication models measured on this machine's gloo, and will keep a hot table in
column strips, or whole, to save bytes where one host's NVLink would let it cut the
table into row blocks. ``neuroshard measure`` times compute only, so that trade was
never measured. This script trains each candidate plan of a task for a few iterations
on the included runtime (``runtime.evaluate.measure_alternating``: D gloo processes,
the fused kernel, the plans' steps interleaved, the order rotated between runs) and
reports which is fastest per iteration, and the communication models' error on them.

Per task (``--family`` tables on D devices), the plans:

- ``search``: NeuroShard with the default network (the trade as the search makes it);
- ``search-one-host``: NeuroShard for one host of D ranks (exchange nearly free);
- ``hot-table-wise`` / ``hot-column-wise`` / ``hot-row-wise``: NeuroShard with the
  task's hottest table (most bytes looked up per sample) constrained to that layout
  (column-wise: at least D strips), the other tables placed by the search;
- ``size-lookup``: the greedy baseline.

Printed per plan: the median over runs of the slowest device's embedding iteration
(compute + forward + backward exchange, the quantities the models predict), its
compute and exchange parts, the whole step (with the dense part), the simulator's
estimate, and the exchange's error (per device, measured forward+backward exchange
against the models', GMAE). "A/A" is the first plan run twice.

    python experiments/comm_tradeoff.py --devices 2 4 --tasks 2

Writes ``--out``/comm_tradeoff.csv and ``.md``.
"""
from __future__ import annotations

import argparse
import copy
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.costmodels.metrics import gmae
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.errors import NeuroShardError
from neuroshard.runtime.evaluate import measure_alternating
from neuroshard.search.api import shard
from neuroshard.tables import TableSet
from neuroshard.topology import Topology

log = logging.getLogger("comm_tradeoff")

LAYOUTS = {"hot-table-wise": {"sharding_types": ["table_wise"]},
           "hot-column-wise": {"sharding_types": ["column_wise"]},
           "hot-row-wise": {"sharding_types": ["row_wise"]}}


def hottest(tables: TableSet) -> str:
    """The table with the most bytes looked up per sample (pooling x width)."""
    return max(tables, key=lambda t: t.pooling_factor * t.embedding_dim).name


def with_layout(tables: TableSet, name: str, rule: dict) -> TableSet:
    out = []
    for t in tables:
        t = copy.copy(t)
        if t.name == name:
            t.constraints = dict(rule)
        out.append(t)
    return TableSet(tables.name, out, tables.batch_size, tables.extra)


def plans_of(tables: TableSet, devices: int, memory: int, models) -> dict:
    plans = {"search": shard(tables, devices, memory, cost_models=models),
             "search-one-host": shard(tables, devices, memory, cost_models=models,
                                      topology=Topology(devices, local_world_size=devices))}
    hot = hottest(tables)
    for name, rule in LAYOUTS.items():
        rule = dict(rule, min_shards=devices) if name == "hot-column-wise" else rule
        if name == "hot-column-wise" and tables[hot].embedding_dim < 4 * devices:
            continue
        try:
            plans[name] = shard(with_layout(tables, hot, rule), devices, memory, cost_models=models)
        except NeuroShardError as exc:
            log.warning("%s: no %s plan (%s)", tables.name, name, str(exc).splitlines()[0])
    plans["size-lookup"] = shard(tables, devices, memory, algorithm="size-lookup", cost_models=models)
    plans["A/A"] = plans["search"]
    return plans


def layout_of(plan, table: str) -> str:
    try:
        return plan.sharding_type(table)
    except Exception:  # noqa: BLE001 (a layout TorchRec has no name for)
        return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="hot-few", choices=sorted(FAMILIES))
    parser.add_argument("--devices", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[4, 8])
    parser.add_argument("--runs", type=int, default=3, help="interleaved runtime runs (default: 3)")
    parser.add_argument("--iterations", type=int, default=6, help="measured steps per plan and run (default: 6)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", default="experiments/results/comm_tradeoff")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    models = load_cost_models()
    rows = []
    for devices in args.devices:
        for i, (tables, memory) in enumerate(family_tasks(args.family, devices, args.tasks,
                                                          tuple(args.tables_per_device), seed=args.seed)):
            tables = tables.at_batch(models.batch_size)
            hot = hottest(tables)
            plans = plans_of(tables, devices, memory, models)
            runs = measure_alternating(plans, tables, runs=args.runs, iterations=args.iterations, devices=devices)
            for name, plan in plans.items():
                per_run = runs[name]
                emb = [m.max_device_cost_ms for m in per_run]
                step = [max(d["step_ms"] for d in m.per_device) for m in per_run]
                comp = [max(d["compute_ms"] for d in m.per_device) for m in per_run]
                comm_dev = np.median([[d["fwd_comm_ms"] + d["bwd_comm_ms"] for d in m.per_device] for m in per_run],
                                     axis=0)
                est = plan.estimate or {}
                est_comm = np.array(est.get("per_device_fwd_comm_ms", [np.nan] * devices)) + \
                    np.array(est.get("per_device_bwd_comm_ms", [0.0] * devices))
                rows.append({"devices": devices, "task": i, "tables": len(tables), "hot_table": hot, "plan": name,
                             "hot_layout": layout_of(plan, hot), "shards": len(plan.shards),
                             "embedding_ms": float(np.median(emb)), "compute_ms": float(np.median(comp)),
                             "exchange_ms": float(comm_dev.max()), "step_ms": float(np.median(step)),
                             "estimated_ms": float(est.get("max_device_cost_ms", np.nan)),
                             "exchange_gmae": float(gmae(est_comm, comm_dev)) if np.all(est_comm > 0) else np.nan,
                             "a2a_width_max": max(sum(s.num_cols for s in plan.shards_on(d)) for d in range(devices))})
            task = pd.DataFrame([r for r in rows if r["devices"] == devices and r["task"] == i])
            base = float(task.loc[task["plan"] == "search", "embedding_ms"].iloc[0])
            task["vs_search"] = task["embedding_ms"] / base
            print(f"\n{tables.name} ({len(tables)} tables, {devices} devices, hot table {hot})")
            print(task[["plan", "hot_layout", "shards", "embedding_ms", "compute_ms", "exchange_ms", "step_ms",
                        "estimated_ms", "exchange_gmae", "vs_search"]].round(3).to_string(index=False), flush=True)
    df = pd.DataFrame(rows)
    df["vs_search"] = df["embedding_ms"] / df.groupby(["devices", "task"])["embedding_ms"].transform(
        lambda s: float(s[df.loc[s.index, "plan"] == "search"].iloc[0]))
    real = df[df["plan"] != "A/A"]
    fastest = real.loc[real.groupby(["devices", "task"])["embedding_ms"].idxmin(), ["devices", "task", "plan"]]
    summary = real.groupby("plan").agg(tasks=("vs_search", "size"),
                                       vs_search_geomean=("vs_search", lambda s: float(np.exp(np.log(s).mean()))),
                                       exchange_gmae=("exchange_gmae", "mean")).round(3)
    aa = df[df["plan"] == "A/A"]["vs_search"]
    text = (summary.to_string() + f"\n\nA/A (search run twice): {', '.join(f'{x:.3f}' for x in aa)}\n"
            f"fastest per task: {', '.join(f'D={r.devices}/t{r.task}: {r.plan}' for r in fastest.itertuples())}")
    print("\n" + text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "comm_tradeoff.csv", index=False)
    cmd = (f"python experiments/comm_tradeoff.py --family {args.family} --devices {' '.join(map(str, args.devices))} "
           f"--tasks {args.tasks} --runs {args.runs} --iterations {args.iterations} --seed {args.seed}")
    (out / "comm_tradeoff.md").write_text(
        f"# Compute for bytes: plans trained on {'/'.join(map(str, args.devices))} gloo processes\n\n`{cmd}`\n\n"
        f"Machine: {cpu_model()}; batch {models.batch_size}; embedding ms = the slowest device's compute + exchange "
        f"(median over runs).\n\n```\n{df.round(3).to_string(index=False)}\n\n{text}\n```\n")


if __name__ == "__main__":
    main()
