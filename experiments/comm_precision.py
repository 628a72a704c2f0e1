"""What does fp16/bf16 communication save in the all-to-all of pooled embeddings?

    python experiments/comm_precision.py                    # 2 gloo processes (about 1-2 min)
    python experiments/comm_precision.py --devices 3 --widths 256 1024

Real processes (``CommBenchmark``: gloo on CPU, NCCL on CUDA) run the training
runtime's own exchange (``PooledExchange``) at each precision in turn, round after
round (the order rotating), for per-device widths of a realistic plan (every device
the same width, e.g. 8 tables of 128 columns = 1024). Printed per width: forward and
backward medians over passes of the slowest device, at fp32, fp16 and bf16, and each
precision's ratio to fp32; written to ``--out`` as ``comm_precision.csv``. The casts
before and after each all-to-all are inside the timing, as in training.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from common import write_source
from neuroshard.costmodels.samples.comm import CommBenchmark
from neuroshard.validate import COMM_PRECISIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 1024, 4096],
                        help="per-device widths (default: 256 1024 4096)")
    parser.add_argument("--batch-size", type=int, default=4096, help="global batch (default 4096)")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/precision"))
    args = parser.parse_args()

    times = {(w, p): {"fwd": [], "bwd": []} for w in args.widths for p in COMM_PRECISIONS}
    with CommBenchmark(args.devices, batch_size=args.batch_size, warmup=2, repeats=args.repeats) as bench:
        for r in range(args.passes):
            order = COMM_PRECISIONS[r % 3:] + COMM_PRECISIONS[:r % 3]
            for width in args.widths:
                for precision in order:
                    m = bench.measure([width] * args.devices, comm_precision=precision)
                    times[width, precision]["fwd"].append(max(m.fwd_ms))
                    times[width, precision]["bwd"].append(max(m.bwd_ms))
    rows = []
    for width in args.widths:
        base = {k: statistics.median(times[width, "fp32"][k]) for k in ("fwd", "bwd")}
        for precision in COMM_PRECISIONS:
            med = {k: statistics.median(times[width, precision][k]) for k in ("fwd", "bwd")}
            mib = args.batch_size * width * (4 if precision == "fp32" else 2) * (args.devices - 1) / args.devices / 2**20
            rows.append({"devices": args.devices, "batch_size": args.batch_size, "width": width,
                         "precision": precision, "sent_mib_per_device": round(mib, 2),
                         "fwd_ms": round(med["fwd"], 3), "bwd_ms": round(med["bwd"], 3),
                         "fwd_ratio": round(med["fwd"] / base["fwd"], 3), "bwd_ratio": round(med["bwd"] / base["bwd"], 3)})
    df = pd.DataFrame(rows)
    print(df.to_string(index=False))
    args.out.mkdir(parents=True, exist_ok=True)
    write_source(args.out, name="SOURCE.comm_precision.json")
    df.to_csv(args.out / "comm_precision.csv", index=False)
    print(f"wrote {args.out / 'comm_precision.csv'}")


if __name__ == "__main__":
    main()
