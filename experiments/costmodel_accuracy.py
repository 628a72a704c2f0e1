"""How accurate are the cost models on tables they never saw?

K-fold by table: the measured shard sets' source tables are partitioned into K groups;
fold k trains every model (neural, gradient-boosted trees, analytic) on the sets with no
table of group k and predicts the sets made only of group k's tables (sets mixing both
are used by neither). Predictions of all folds are pooled and scored once: GMAE, MAPE,
Kendall tau and plan-pair ordering accuracy. For context, ``compute_seen_tables``
repeats this with folds drawn over shard sets at random (new combinations of known
tables, all set sizes). Communication samples (no tables) are split K-fold at random. Also printed: the measurement noise floor (the spread of
repeated timings of one sample), below which no model can be shown to be better.

    python experiments/costmodel_accuracy.py                      # the shipped CPU data
    python experiments/costmodel_accuracy.py --tune 20                  # as the shipped checkpoint was made
    python experiments/costmodel_accuracy.py --data DIR --comm-data DIR2 DIR3 --folds 4
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from neuroshard.costmodels.measure.store import load_comm_data, load_compute_data
from neuroshard.costmodels.metrics import comm_predictions, cost_metrics, gmae, plan_metrics
from neuroshard.costmodels.pretrain import (
    METRIC_COLUMNS,
    fit_comm_models,
    fit_compute_models,
    format_table,
    load_comm,
    load_compute,
    table_folds,
)

DATA = Path(__file__).resolve().parent.parent / "neuroshard" / "checkpoints" / "data" / "cpu"
MODELS = ("neural", "tree", "analytic")


def random_folds(num_sets: int, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    fold_of = np.random.default_rng(seed).permutation(num_sets) % folds
    return [(np.flatnonzero(fold_of != k), np.flatnonzero(fold_of == k), np.zeros(0, int)) for k in range(folds)]


def compute_rows(folder: Path, folds: int, epochs: int, seed: int, by_table: bool = True, tune: int = 0
                 ) -> tuple[list[dict], str]:
    data = load_compute(folder)
    pred = {name: np.full(len(data), np.nan) for name in MODELS}
    splits = table_folds(data.tables, folds, seed) if by_table else random_folds(len(data), folds, seed)
    for k, (train_rows, test_rows, _) in enumerate(splits):
        if len(test_rows) == 0 or len(train_rows) < 20:
            continue
        models, _ = fit_compute_models(data, train_rows, epochs, tune, seed + k)
        test = data.subset(test_rows)
        for name in MODELS:
            pred[name][test_rows] = models[name].predict(test.sets)
    held = np.isfinite(pred["neural"])
    target = "compute" if by_table else "compute_seen_tables"
    rows = [{"target": target, "model": name, **cost_metrics(pred[name][held], data.costs_ms[held], seed=seed)}
            for name in MODELS]
    sizes = np.array([len(s) for s in data.sets])
    cv = np.array([r["cv"] for r in load_compute_data(folder)])
    if not by_table:
        return rows, f"compute_seen_tables: {folds}-fold over shard sets at random (tables seen, combinations new)"
    note = (f"compute: {len(data)} shard sets over {len(set().union(*data.tables))} tables, {folds}-fold by table: "
            f"{held.sum()} held-out sets scored (mean {sizes[held].mean():.1f} shards/set vs {sizes.mean():.1f} "
            f"overall); timing cv median {np.median(cv):.3f}; {repeat_noise(folder)}")
    return rows, note


def repeat_noise(folder: Path) -> str:
    """The noise floor: GMAE between two measurements of the very same shard set (drawn twice)."""
    costs: dict[str, list[float]] = {}
    for record in load_compute_data(folder):
        key = json.dumps(sorted(json.dumps(s, sort_keys=True) for s in record["shards"]))
        costs.setdefault(key, []).append(record["cost_ms"])
    pairs = np.array([v[:2] for v in costs.values() if len(v) > 1])
    if not len(pairs):
        return "no shard set was measured twice"
    return f"GMAE between repeated measurements of the same set: {100 * gmae(pairs[:, 0], pairs[:, 1]):.1f}% " \
           f"({len(pairs)} sets measured twice)"


def comm_rows(folders: list[Path], folds: int, epochs: int, seed: int) -> tuple[list[dict], str]:
    groups, meta = load_comm(folders)
    rng = np.random.default_rng(seed)
    fold_of = [rng.permutation(len(g)) % folds for g in groups]
    pooled = {name: {d: ([], []) for d in ("fwd", "bwd", "reduce")} for name in MODELS}
    for k in range(folds):
        train = [g.subset(np.flatnonzero(f != k)) for g, f in zip(groups, fold_of)]
        test = [g.subset(np.flatnonzero(f == k)) for g, f in zip(groups, fold_of)]
        models = fit_comm_models(train, meta["batch_size"], epochs, seed + k)
        for name in MODELS:
            for direction, (preds, trues) in comm_predictions(models[name], test).items():
                pooled[name][direction][0].extend(preds)
                pooled[name][direction][1].extend(trues)
    rows = []
    for direction in ("fwd", "bwd", "reduce"):
        for name in MODELS:
            preds, trues = pooled[name][direction]
            # pool the folds of one device count together (pair accuracy compares within a count)
            by_d: dict[int, tuple[list, list]] = {}
            for p, t in zip(preds, trues):
                by_d.setdefault(p.shape[1], ([], []))
                by_d[p.shape[1]][0].append(p)
                by_d[p.shape[1]][1].append(t)
            rows.append({"target": f"comm_{direction}", "model": name, **plan_metrics(
                [np.concatenate(v[0]) for v in by_d.values()], [np.concatenate(v[1]) for v in by_d.values()], seed)})
    cv = np.array([r.get("cv_fwd", np.nan) for f in folders for r in load_comm_data(f)])
    note = (f"comm: {', '.join(f'{len(g)} samples on {g.num_devices} devices' for g in groups)}, {folds}-fold at "
            f"random; forward timing cv median {np.nanmedian(cv):.3f}")
    return rows, note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA / "compute", help="folder with compute.jsonl")
    parser.add_argument("--comm-data", type=Path, nargs="*", default=None,
                        help="folders with comm.jsonl (default: every comm*/ beside the compute data)")
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tune", type=int, default=0, metavar="N",
                        help="optuna trials per fold for the neural compute model (on the fold's own validation split)")
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    comm_folders = args.comm_data if args.comm_data is not None else sorted(
        p.parent for p in args.data.parent.glob("**/comm*/comm.jsonl"))
    rows, notes = [], []
    for by_table in (True, False):
        r, n = compute_rows(args.data, args.folds, args.epochs, args.seed, by_table, args.tune)
        rows += r
        notes.append(n)
    if comm_folders:
        r, n = comm_rows(comm_folders, args.folds, args.epochs, args.seed)
        rows += r
        notes.append(n)
    table = pd.DataFrame(rows, columns=["target", "model", *METRIC_COLUMNS])
    print("\n".join(notes))
    print(format_table(table))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
