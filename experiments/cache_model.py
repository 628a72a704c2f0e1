"""How close the cache model's miss rates come to exact replays of long streams.

    python experiments/cache_model.py                       # default grid, about a minute
    python experiments/cache_model.py --batches 80 --seed 7 # longer streams, another draw

For every table of a grid of access descriptions (power laws of several exponents and
sizes, uniform access, the dlrm-2021 preset's reuse histograms, and recorded streams whose
hot set drifts over time), both eviction policies (LRU, LFU) and several cache fractions:

* **predicted**: ``neuroshard.datasets.cache_model.predict_miss_rates`` from the table's
  description alone (a recorded table: its recording replayed, as ``tables cache`` does);
* **replayed**: ``replay_miss_rates`` of a long stream drawn afresh from the same
  description (``--batches`` batches, its own seed; a drifting table: a new recording of
  the same drifting process, longer than the one the prediction read).

Printed and written to ``--out`` (default ``experiments/results/cache_model``):
``rows.csv`` (one row per table, policy and fraction), ``summary.md`` (mean absolute
error in percentage points, overall, per policy and per kind of table, and the worst
case) and ``miss_curves.png`` (miss rate against cache fraction, predicted lines and
replayed points). The aim: mean absolute error within 2 points, none over 5.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from common import write_source
from neuroshard.datasets.cache_model import draw_stream, predict_miss_rates, replay_miss_rates
from neuroshard.datasets.synthetic import generate
from neuroshard.tables import Table

FRACTIONS = (0.001, 0.01, 0.05, 0.2, 0.5)


def drifting_recording(path: Path, rows: int, pooling: float, batch_size: int, batches: int, alpha: float,
                       drift: float, seed: int) -> None:
    """A dlrm_datasets file of one table: ``batches`` batches of power-law lookups whose
    popularity ranks shift by ``drift`` x rows per batch (the hot set moves over time)."""
    rng = np.random.default_rng(seed)
    from neuroshard.datasets.access import _scatter, _zipf_ranks, lengths_for
    ids, lengths = [], []
    for b in range(batches):
        n = int(round(batch_size * pooling))
        ranks = (_zipf_ranks(alpha, rows, n, rng) + int(b * drift * rows)) % rows
        ids.append(_scatter(ranks, rows))
        lengths.append(lengths_for(n, batch_size, rng))
    lengths = np.concatenate(lengths)[None, :]
    indices = np.concatenate(ids)
    offsets = np.concatenate([[0], np.cumsum(lengths[0])])
    torch.save((torch.from_numpy(indices), torch.from_numpy(offsets), torch.from_numpy(lengths)), path)


def grid(batch_size: int, folder: Path, batches: int, seed: int) -> list[tuple[str, Table, Table | None]]:
    """(kind, table for the prediction, table whose stream is the truth when not drawn afresh)."""
    out = []
    for alpha in (0.6, 0.9, 1.05, 1.2, 1.5):
        for rows, pooling in ((100_000, 4.0), (1_000_000, 2.0)):
            out.append(("zipf", Table(f"zipf{alpha}-r{rows}", rows, 16, pooling, {"zipf_alpha": alpha}), None))
    out.append(("uniform", Table("uniform-r200k", 200_000, 16, 3.0), None))
    for t in generate("dlrm-2021", 6, seed=seed).tables:
        if t.num_embeddings <= 3_000_000:
            out.append(("histogram", t, None))
    for drift in (0.0005, 0.002):
        for alpha in (0.9, 1.2):
            name = f"drift{drift}-a{alpha}"
            recorded = folder / f"{name}.pt"
            truth = folder / f"{name}-truth.pt"
            # the recording the prediction replays, and another recording of the same drifting process
            drifting_recording(recorded, 200_000, 2.0, batch_size, 4 * batches, alpha, drift, seed)
            drifting_recording(truth, 200_000, 2.0, batch_size, 4 * batches, alpha, drift, seed + 1)
            out.append(("drifting", Table(name, 200_000, 16, 2.0, {"indices": str(recorded)}),
                        Table(name, 200_000, 16, 2.0, {"indices": str(truth)})))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--batches", type=int, default=200, help="batches per replayed stream (default: 200)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", default="experiments/results/cache_model")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_source(out)
    scratch = tempfile.TemporaryDirectory(prefix="cache-model-")  # the drifting recordings: large, not kept
    folder = Path(scratch.name)
    start = time.perf_counter()
    rows = []
    from neuroshard.datasets.cache_model import recorded_stream
    for kind, table, truth_table in grid(args.batch_size, folder, args.batches, args.seed):
        if truth_table is None:
            stream = draw_stream(table, args.batch_size, args.batches, seed=args.seed + 101)
        else:  # the truth's recording: 4 recorded batches per replayed one, cut at the tables' batch
            stream = recorded_stream(truth_table, 4 * args.batch_size)
        for algorithm in ("lru", "lfu"):
            # LFU counts from the replay's start: its second half has 0.75 x the batches of history on average
            history = int(0.75 * len(stream)) if algorithm == "lfu" else None
            predicted = predict_miss_rates(table, args.batch_size if kind != "drifting" else 4 * args.batch_size,
                                           FRACTIONS, algorithm, history=history)
            unique, replayed = replay_miss_rates(stream, table.num_embeddings, FRACTIONS, algorithm)
            # steady state: the warm-up half filled the cache, or saw every row the stream ever uses
            # (else the measured half still pays first-use misses that a long run would not)
            seen = np.unique(np.concatenate(stream[:len(stream) // 2])).size
            used = np.unique(np.concatenate(stream)).size
            for f, r in zip(FRACTIONS, replayed):
                rows.append({"kind": kind, "table": table.name, "rows": table.num_embeddings,
                             "algorithm": algorithm, "fraction": f, "predicted": predicted.miss_rate[f],
                             "replayed": r, "error_pp": 100 * (predicted.miss_rate[f] - r),
                             "unique_predicted": predicted.unique_per_batch, "unique_replayed": unique,
                             "method": predicted.method,
                             "steady": seen >= min(f * table.num_embeddings, used)})
        print(f"{kind:9s} {table.name:24s} done ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    df = pd.DataFrame(rows)
    df.to_csv(out / "rows.csv", index=False)
    df["abs_pp"] = df["error_pp"].abs()
    cold = df[~df["steady"]]
    df = df[df["steady"]]  # a replay whose cache never filled is not at steady state: not a judge
    by = df.groupby(["algorithm", "kind"])["abs_pp"].agg(["mean", "max", "count"]).round(2)
    overall = df.groupby("algorithm")["abs_pp"].agg(["mean", "max", "count"]).round(2)
    text = (f"`python experiments/cache_model.py --batch-size {args.batch_size} --batches {args.batches} "
            f"--seed {args.seed}`\n\nmean absolute error (percentage points), overall: {df['abs_pp'].mean():.2f}, "
            f"worst {df['abs_pp'].max():.2f}, over {len(df)} (table, policy, fraction) cases; {len(cold)} cases left out "
            f"because the replay's warm-up half neither filled the cache nor saw every row the stream uses (no steady state: "
            f"{', '.join(sorted(set(cold['table'] + '@' + cold['fraction'].astype(str))))})\n\n"
            f"```\n{overall.to_string()}\n\n{by.to_string()}\n```\n\nworst rows:\n\n"
            f"```\n{df.nlargest(8, 'abs_pp')[['kind', 'table', 'algorithm', 'fraction', 'predicted', 'replayed']].round(4).to_string(index=False)}\n```\n")
    (out / "summary.md").write_text(text)
    print(text)
    _plot(df, out / "miss_curves.png")
    print(f"wrote {out}/ ({time.perf_counter() - start:.0f} s)")


def _plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    picks = df.drop_duplicates("table").groupby("kind").head(2)["table"].tolist()
    for ax, algorithm in zip(axes, ("lru", "lfu")):
        for i, name in enumerate(picks):
            part = df[(df["table"] == name) & (df["algorithm"] == algorithm)]
            color = f"C{i}"
            ax.plot(part["fraction"], part["predicted"], "-", color=color, label=name)
            ax.plot(part["fraction"], part["replayed"], "o", color=color)
        ax.set_xscale("log")
        ax.set_xlabel("cache size, fraction of the table's rows")
        ax.set_title(f"{algorithm.upper()}: predicted (lines) vs replayed (points)")
    axes[0].set_ylabel("miss rate (share of a batch's unique rows)")
    axes[1].legend(fontsize=7)
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


if __name__ == "__main__":
    main()
