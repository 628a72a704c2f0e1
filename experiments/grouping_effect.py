"""Why placements of the same unsplit tables differ in total work.

For each family task (``datasets.families.family_tasks``: 15-40 tables per device by
default, memory raised where needed so that every table fits a device unsplit), the
script builds several groupings of the *same unsplit tables* over the devices (the
plans of the greedy baselines, random placements with several seeds, and one grouping
repeated as an A/A control), and times, in ONE interleaved run of the device timer
(``costmodels.samples.timing``): every device of every grouping, and every table alone.
It does so under two protocols: the cache flushed before every timed run (what
``neuroshard measure`` and calibration do) and a warm cache (no flush, as in training,
where a device's hot rows stay cached between iterations).

Printed per task and protocol:
- the spread of total work over groupings (max/min of the sum of device times), beside
  the A/A control's (the noise of one total);
- per device, non-additivity = device time / sum of its tables' times alone, and its
  Spearman correlation with the device's working set (bytes of its tables), its number
  of tables and its lookups per sample;
- whether the cost models see it: Spearman, over groupings, of the predicted and the
  measured total, and the predicted total's error (GMAE over groupings).

    python experiments/grouping_effect.py --families hot-few criteo-terabyte broad --devices 8

Writes ``--out``/summary.md and ``--out``/devices.csv.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from common import write_source
from neuroshard.constants import FP32_BYTES
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.samples.store import cpu_model
from neuroshard.costmodels.samples.timing import time_devices
from neuroshard.costmodels.metrics import gmae
from neuroshard.datasets.families import family_tasks
from neuroshard.plan import Shard
from neuroshard.search.api import search_plan
from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet
from neuroshard.types import whole_pieces

GREEDY = ("size", "lookup", "size-lookup", "dim")


def groupings(tables: TableSet, devices: int, memory: int, models, random_seeds: int) -> dict[str, list[list[Shard]]]:
    """Name -> per-device shard lists, every table unsplit."""
    out = {}
    for algorithm, seed in [(a, 0) for a in GREEDY] + [("random", s) for s in range(random_seeds)]:
        plan = search_plan(tables, devices, memory, algorithm=algorithm, cost_models=models, seed=seed)
        whole = all(s.num_rows == tables[s.table].num_embeddings and s.num_cols == tables[s.table].embedding_dim
                    for s in plan.shards)
        if whole:
            out[f"{algorithm}" if algorithm != "random" else f"random{seed}"] = [plan.shards_on(d)
                                                                              for d in range(devices)]
    return out


def spearman(a, b) -> float:
    return float(spearmanr(a, b).statistic) if len(set(a)) > 1 and len(set(b)) > 1 else math.nan


def run_task(tables: TableSet, devices: int, memory: int, models, args) -> tuple[list[str], list[dict]]:
    at_batch = tables.at_batch(models.batch_size)
    biggest = max(t.size_bytes(FP32_BYTES) for t in tables)
    memory = max(memory, int(math.ceil(biggest * 1.02)))  # every table fits a device unsplit
    groups = groupings(at_batch, devices, memory, models, args.random)
    groups["size (A/A)"] = groups["size"]
    names = list(groups)
    singles = [[Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, 0)] for t in tables]
    every = [d for n in names for d in groups[n]] + singles
    sim = Simulator(at_batch, devices, models)
    piece_of = dict(zip((t.name for t in tables), whole_pieces(at_batch)))
    lines, rows = [], []
    for protocol, flush in (("flushed", None), ("warm", 0)):
        times, config = time_devices(every, at_batch, passes=args.passes, repeats=args.repeats,
                                     batch_size=models.batch_size, flush_bytes=flush, progress=True)
        med = np.array([float(np.median(t)) if t else 0.0 for t in times])
        alone = dict(zip((t.name for t in tables), med[len(every) - len(singles):]))
        totals, maxima, predicted = {}, {}, {}
        for g, name in enumerate(names):
            device_ms = med[g * devices:(g + 1) * devices]
            totals[name], maxima[name] = float(device_ms.sum()), float(device_ms.max())
            pieces, where = [], []
            for d, shards in enumerate(groups[name]):
                for s in shards:
                    pieces.append(piece_of[s.table])
                    where.append(d)
            est = sim.evaluate(pieces, np.array(where)[None, :], risk=0.0)
            predicted[name] = float(est.compute_ms[0].sum())
            for d, shards in enumerate(groups[name]):
                if not shards or name == "size (A/A)":
                    continue
                rows.append({"task": tables.name, "protocol": protocol, "grouping": name, "device": d,
                             "tables": len(shards), "measured_ms": float(device_ms[d]),
                             "alone_sum_ms": sum(alone[s.table] for s in shards),
                             "predicted_ms": float(est.compute_ms[0][d]),
                             "working_set_bytes": sum(s.num_rows * s.num_cols * FP32_BYTES for s in shards),
                             "lookups_per_sample": sum(tables[s.table].pooling_factor for s in shards)})
        real = [n for n in names if n != "size (A/A)"]
        tot = np.array([totals[n] for n in real])
        pred = np.array([predicted[n] for n in real])
        aa = abs(totals["size (A/A)"] / totals["size"] - 1)
        dev = pd.DataFrame([r for r in rows if r["protocol"] == protocol and r["task"] == tables.name])
        ratio = dev["measured_ms"] / dev["alone_sum_ms"]
        lines.append(
            f"| {tables.name} | {protocol} | {len(real)} | {tot.max() / tot.min():.3f} | {100 * aa:.1f}% | "
            f"{ratio.median():.3f} ({ratio.min():.2f}-{ratio.max():.2f}) | "
            f"{spearman(ratio, dev['working_set_bytes']):+.2f} | {spearman(ratio, dev['tables']):+.2f} | "
            f"{spearman(ratio, dev['lookups_per_sample']):+.2f} | {spearman(pred, tot):+.2f} | "
            f"{100 * gmae(pred, tot):.1f}% | {min(maxima.values()) / min(tot / devices):.3f} |")
        print(lines[-1], flush=True)
    return lines, rows


def count_curve(models, args) -> list[str]:
    """One device of N equal small tables, N from 1 to 80, all timed in one interleaved run:
    does a device's cost grow faster than its number of tables?"""
    counts = (1, 2, 5, 10, 20, 40, 60, 80)
    tables = TableSet("count-curve", [Table(f"t{i}", 20_000, 16, 1.0, {"zipf_alpha": 1.05}) for i in range(max(counts))],
                      models.batch_size)
    sets = [[Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, 0) for t in tables.tables[:n]] for n in counts]
    sim = Simulator(tables, 1, models)
    pieces = whole_pieces(tables)
    predicted = [float(sim.set_costs_ms([tuple(sim.piece_ids(pieces[:n]))])[0]) for n in counts]
    lines = ["| tables on the device | " + " | ".join(map(str, counts)) + " |",
             "|---|" + "---|" * len(counts)]
    for protocol, flush in (("flushed", None), ("warm", 0)):
        times, _ = time_devices(sets * 2, tables, passes=args.passes, repeats=args.repeats,
                                batch_size=models.batch_size, flush_bytes=flush)
        med = [float(np.median(a + b)) for a, b in zip(times[:len(counts)], times[len(counts):])]
        lines.append(f"| {protocol}: ms per table | " + " | ".join(f"{m / n:.3f}" for m, n in zip(med, counts)) + " |")
    lines.append("| model: ms per table | " + " | ".join(f"{p / n:.3f}" for p, n in zip(predicted, counts)) + " |")
    for line in lines:
        print(line, flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["hot-few", "criteo-terabyte", "broad"])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--tables-per-device", type=int, nargs=2, default=(15, 40))
    parser.add_argument("--random", type=int, default=4, help="random groupings (seeds) besides the greedy ones")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7, help="task seed (benchmarks elsewhere use 0)")
    parser.add_argument("--cost-model", default=None)
    parser.add_argument("--out", default="experiments/results/grouping_effect")
    parser.add_argument("--count-curve", action="store_true",
                        help="only the cost of one device against its number of equal small tables")
    args = parser.parse_args()
    models = load_cost_models(args.cost_model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_source(out)
    if args.count_curve:
        lines = count_curve(models, args)
        (out / "count_curve.md").write_text(
            "# One device, N equal small tables (20,000 rows x 16, 1 lookup per sample)\n\n"
            f"`python experiments/grouping_effect.py --count-curve --passes {args.passes} --repeats {args.repeats}`\n\n"
            f"Machine: {cpu_model()}; batch {models.batch_size}; each set timed twice in one interleaved run "
            "(median of both).\n\n" + "\n".join(lines) + "\n")
        print(f"wrote {out / 'count_curve.md'}")
        return
    header = ("| task | protocol | groupings | total max/min | A/A | non-additivity median (range) | "
              "rho(ws) | rho(tables) | rho(lookups) | rho(pred, total) | total GMAE | best max / least mean |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(header)
    lines, rows = [], []
    for family in args.families:
        for tables, memory in family_tasks(family, args.devices, args.tasks, tuple(args.tables_per_device),
                                           seed=args.seed):
            got_lines, got_rows = run_task(tables, args.devices, memory, models, args)
            lines += got_lines
            rows += got_rows
    pd.DataFrame(rows).to_csv(out / "devices.csv", index=False)
    command = "python experiments/grouping_effect.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
        for k, v in vars(args).items() if v is not None)
    (out / "summary.md").write_text(
        f"# Grouping effect: the same unsplit tables, grouped differently\n\n`{command}`\n\n"
        f"Machine: {cpu_model()}; cost models '{models.name}' (batch {models.batch_size}).\n\n"
        + header + "\n" + "\n".join(lines) + "\n\n"
        "total max/min: spread of the sum of device times over groupings; A/A: the same grouping timed "
        "twice; non-additivity: device time / sum of its tables' times alone; rho: Spearman over devices "
        "(ws: working-set bytes); rho(pred, total) and total GMAE: the cost models' predicted total against "
        "the measured, over groupings; best max / least mean: the smallest slowest device over the least "
        "total work spread evenly.\n")
    print(f"wrote {out / 'summary.md'}")


if __name__ == "__main__":
    main()
