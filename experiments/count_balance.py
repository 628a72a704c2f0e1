"""Does an even count of tables per device do less total work? (issue 25, item 1, session 37)

In the ``--row-blocks any`` tally at 4 devices the plan of least total work is ``dim``'s in 3 of 4
criteo-terabyte tasks (sessions 35-36): every criteo-terabyte table is 128 wide, so ``dim``'s
greedy is a round robin in table order, the same number of tables on every device. Random's
grouping, about as many tables per device but not exactly, did 5-7% more work, and our plans
3-5% more. This script asks which it is, on the same whole tables of one benchmark task
(``family_tasks``, memory raised so that every table fits a device unsplit), with every device of
every grouping and every table alone timed in ONE interleaved run of ``measure``'s timer:

- ``dim``: the round robin (equal counts), timed twice (the A/A control);
- ``lookup``, ``size``: the greedy baselines;
- ``lpt``: longest first onto the device of least predicted cost (counts free);
- ``lpt-even``: the same, each device capped at ceil(N / D) tables (counts even);
- ``even-K``: random groupings with equal counts; ``uneven-K``: random groupings, counts free.

Printed per grouping: total work over ``dim``'s, the slowest device, the counts' spread; and a
least-squares fit of device time on the sum of its tables' alone times, its count and count
squared: is a device's cost convex in its count?

    python experiments/count_balance.py --family criteo-terabyte --devices 4 --seed 197

Writes ``--out``/summary.md and ``--out``/devices.csv.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from neuroshard.constants import FP32_BYTES
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.costmodels.measure.timing import time_devices
from neuroshard.datasets.families import family_tasks
from neuroshard.plan import Shard
from neuroshard.search.api import shard
from neuroshard.search.placer import greedy_place
from neuroshard.search.simulator import Simulator
from neuroshard.tables import TableSet
from neuroshard.types import whole_pieces


def lpt(cost: np.ndarray, devices: int, cap: int | None) -> np.ndarray:
    """Longest first onto the least loaded device (with fewer than ``cap`` tables): the search's
    greedy (``placer.greedy_place``) with every table one unit of width under the cap, memory aside."""
    caps = None if cap is None else np.array([cap])
    return greedy_place(cost, np.zeros(len(cost)), devices, 1, widths=np.ones(len(cost)), caps=caps)[0]


def groupings(tables: TableSet, devices: int, memory: int, models, randoms: int) -> dict[str, np.ndarray]:
    """Name -> each table's device (tables whole)."""
    n = len(tables)
    index = {t.name: i for i, t in enumerate(tables)}
    out = {}
    for key in ("dim", "lookup", "size"):
        plan = shard(tables, devices, memory, algorithm=key, cost_models=models, seed=0)
        where = np.full(n, -1)
        for s in plan.shards:
            assert s.num_rows == tables[s.table].num_embeddings, "a table was split"
            where[index[s.table]] = s.device
        out[key] = where
    sim = Simulator(tables, devices, models)
    pieces = whole_pieces(tables)
    alone = np.array([float(sim.set_costs_ms([tuple(sim.piece_ids([p]))])[0]) for p in pieces])
    out["lpt"] = lpt(alone, devices, None)
    out["lpt-even"] = lpt(alone, devices, math.ceil(n / devices))
    rng = np.random.default_rng(0)
    for k in range(randoms):
        out[f"even-{k}"] = rng.permutation(np.arange(n) % devices)
        out[f"uneven-{k}"] = rng.integers(0, devices, n)
    out["dim (A/A)"] = out["dim"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="criteo-terabyte")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--tables-per-device", type=int, nargs=2, default=(8, 12))
    parser.add_argument("--seed", type=int, default=197)
    parser.add_argument("--randoms", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or f"experiments/results/count_balance_{args.family}_{args.devices}dev_seed{args.seed}")
    out.mkdir(parents=True, exist_ok=True)

    models = load_cost_models(None)
    (tables, memory), = family_tasks(args.family, args.devices, 1, tuple(args.tables_per_device), seed=args.seed)
    tables = tables.at_batch(models.batch_size)
    memory = max(memory, math.ceil(max(t.size_bytes(FP32_BYTES) for t in tables) * 1.02))
    groups = groupings(tables, args.devices, memory, models, args.randoms)
    names = list(groups)
    shards = [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, 0) for t in tables]
    every = [[shards[i] for i in np.flatnonzero(groups[g] == d)] for g in names for d in range(args.devices)]
    every += [[s] for s in shards]
    times, _ = time_devices(every, tables, passes=args.passes, batch_size=models.batch_size, progress=True)
    med = np.array([float(np.median(t)) if t else 0.0 for t in times])
    alone = med[len(names) * args.devices:]

    rows, lines = [], []
    for g, name in enumerate(names):
        dev = med[g * args.devices:(g + 1) * args.devices]
        for d in range(args.devices):
            members = np.flatnonzero(groups[name] == d)
            rows.append({"grouping": name, "device": d, "tables": len(members), "measured_ms": dev[d],
                         "alone_sum_ms": float(alone[members].sum()),
                         "working_set_mib": sum(min(tables[i].num_embeddings, 1_000_000) * tables[i].embedding_dim
                                                * FP32_BYTES for i in members) / 2**20,
                         "lookups_per_sample": float(sum(tables[i].pooling_factor for i in members))})
    df = pd.DataFrame(rows)
    df.to_csv(out / "devices.csv", index=False)
    per = df.groupby("grouping", sort=False).agg(total_ms=("measured_ms", "sum"), max_ms=("measured_ms", "max"),
                                                 count_min=("tables", "min"), count_max=("tables", "max"),
                                                 alone_max_ms=("alone_sum_ms", "max"))
    per["total_over_dim"] = per["total_ms"] / per.loc["dim", "total_ms"]
    per["max_over_dim"] = per["max_ms"] / per.loc["dim", "max_ms"]
    lines.append(f"# python experiments/count_balance.py --family {args.family} --devices {args.devices} "
                 f"--seed {args.seed} --passes {args.passes}\n\nCPU: {cpu_model()}; {len(tables)} tables; "
                 f"sum of tables alone "
                 f"{alone.sum():.2f} ms\n")
    lines.append(per.round(3).to_string())
    fit = df[df["grouping"] != "dim (A/A)"]
    x = np.column_stack([fit["alone_sum_ms"], fit["tables"], fit["tables"] ** 2, np.ones(len(fit))])
    coef, *_ = np.linalg.lstsq(x, fit["measured_ms"], rcond=None)
    resid = fit["measured_ms"] - x @ coef
    x0 = x[:, [0, 1, 3]]
    coef0, *_ = np.linalg.lstsq(x0, fit["measured_ms"], rcond=None)
    resid0 = fit["measured_ms"] - x0 @ coef0
    lines.append(f"\ndevice ms = {coef[0]:.3f} x alone_sum + {coef[1]:.3f} x n + {coef[2]:.4f} x n^2 + "
                 f"{coef[3]:.3f}: mean abs error {100 * np.mean(np.abs(resid / fit['measured_ms'])):.2f}% "
                 f"(without n^2: {100 * np.mean(np.abs(resid0 / fit['measured_ms'])):.2f}%)")
    text = "\n".join(lines)
    print(text)
    (out / "summary.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
