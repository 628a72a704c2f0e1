"""How much faster (or slower) is the fused kernel with fp16 weights than with fp32?

    python experiments/precision_ratio.py              # 36 shard sets, 3 passes (about 3 min on 2 cores)
    python experiments/precision_ratio.py --sets 12 --no-write

Random shard sets drawn as ``collect compute`` draws them (1-8 tables of the dlrm-2021
preset, widths 4-128, some row slices, under 1 GiB, rows capped at 1M) are each built
twice, with fp32 and with fp16 weights, and timed in turn (the order alternating every
round) with the kernel benchmark's protocol (cache flush before every run, the thread's
CPU clock) at the cost models' batch size. A set's ratio is its median fp16 time over its
median fp32 time; the stored ratio is the geometric mean over sets. It is written, with
this command and the machine, to ``neuroshard/checkpoints/precision_scaling.json``, where
the simulator reads it (``costmodels.precision``), and per set to
``experiments/results/precision/precision_ratio.csv``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from common import write_source
from neuroshard.constants import MEASURED_BATCH_SIZE
from neuroshard.costmodels.samples.kernel import KernelBenchmark
from neuroshard.costmodels.samples.store import cpu_model
from neuroshard.costmodels.precision import SCALING_FILE
from neuroshard.datasets.synthetic import generate
from neuroshard.measured.collect import sample_shard_set

PRECISIONS = ("fp32", "fp16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=int, default=36)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/precision"))
    parser.add_argument("--no-write", action="store_true", help=f"do not update {SCALING_FILE.name}")
    args = parser.parse_args()

    tables = generate("dlrm-2021", num_tables=200, seed=args.seed).tables
    benches = {p: KernelBenchmark(batch_size=MEASURED_BATCH_SIZE, warmup=1, repeats=3, max_repeats=5,
                                  weights_precision=p) for p in PRECISIONS}
    rows = []
    for i in range(args.sets):
        rng = np.random.default_rng(args.seed + i)
        shards = sample_shard_set(tables, rng, 8, 1 << 30, MEASURED_BATCH_SIZE, [4, 8, 16, 32, 64, 128])
        times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for r in range(args.passes):
            for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]):
                times[p].append(benches[p].measure(shards).cost_ms)
        fp32, fp16 = (statistics.median(times[p]) for p in PRECISIONS)
        rows.append({"set": i, "shards": len(shards), "width": sum(s.embedding_dim for s in shards),
                     "mib_fp32": round(sum(min(s.num_embeddings, benches["fp32"].max_rows) * s.embedding_dim * 4
                                           for s in shards) / 2**20, 1),
                     "fp32_ms": round(fp32, 4), "fp16_ms": round(fp16, 4), "ratio": round(fp16 / fp32, 4)})
        print(f"set {i:3d}: {len(shards)} shards, fp32 {fp32:8.3f} ms, fp16 {fp16:8.3f} ms, ratio {fp16 / fp32:.3f}",
              flush=True)
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_source(args.out, name="SOURCE.precision_ratio.json")
    df.to_csv(args.out / "precision_ratio.csv", index=False)
    ratios = df["ratio"].to_numpy()
    geo = float(np.exp(np.log(ratios).mean()))
    q1, q3 = (float(x) for x in np.quantile(ratios, [0.25, 0.75]))
    print(f"fp16 / fp32 kernel time over {len(df)} sets: geometric mean {geo:.3f} "
          f"(quartiles {q1:.3f}-{q3:.3f}, min {ratios.min():.3f}, max {ratios.max():.3f})")
    if args.no_write:
        return
    record = {"fp16": {"compute_ratio_to_fp32": round(geo, 4), "quartiles": [round(q1, 4), round(q3, 4)],
                       "sets": len(df), "passes": args.passes, "kernel": benches["fp32"].kernel,
                       "batch_size": MEASURED_BATCH_SIZE, "machine": cpu_model(),
                       "command": " ".join(["python experiments/precision_ratio.py", *sys.argv[1:]]),
                       "created": dt.date.today().isoformat()}}
    SCALING_FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {SCALING_FILE}")


if __name__ == "__main__":
    main()
