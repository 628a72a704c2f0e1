"""How fast and how steady is cost-data measurement on this machine?

Runs a short real collection (compute shard sets, then all-to-all samples) into a
temporary folder for a fixed time each and prints measurements per minute and the
spread (median coefficient of variation of the repeats). With ``--data`` it also
summarises existing dataset folders (spread only: records carry no timestamps).

    python experiments/measure_benchmark.py --tables out/measure_tables.json --seconds 60
    python experiments/measure_benchmark.py --data neuroshard/checkpoints/data/cpu/compute \
        neuroshard/checkpoints/data/cpu/comm/comm2 --seconds 0
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from neuroshard.costmodels.measure import load_comm_data, load_compute_data, read_meta
from neuroshard.measured.collect import collect_comm, collect_compute


def _compute_row(records: list[dict], minutes: float | None, label: str) -> dict:
    cv = np.array([r["cv"] for r in records])
    cost = np.array([r["cost_ms"] for r in records])
    return {"what": label, "samples": len(records),
            "per_min": round(len(records) / minutes, 1) if minutes else None,
            "median_cv": round(float(np.median(cv)), 4) if len(cv) else None,
            "p90_cv": round(float(np.quantile(cv, 0.9)), 4) if len(cv) else None,
            "median_ms": round(float(np.median(cost)), 3) if len(cost) else None}


def _comm_row(records: list[dict], minutes: float | None, label: str) -> dict:
    cv = np.array([r["cv_fwd"] for r in records])
    bwd = np.array([np.median(r["bwd_ms"]) for r in records])
    return {"what": label, "samples": len(records),
            "per_min": round(len(records) / minutes, 1) if minutes else None,
            "median_cv": round(float(np.median(cv)), 4) if len(cv) else None,
            "p90_cv": round(float(np.quantile(cv, 0.9)), 4) if len(cv) else None,
            "median_ms": round(float(np.median(bwd)), 3) if len(bwd) else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", default="out/measure_tables.json", help="tables file for compute samples")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of each fresh collection (0: none)")
    parser.add_argument("--devices", type=int, nargs="*", default=[2, 4], help="device counts for comm")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--data", nargs="*", default=[], help="existing dataset folders to summarise")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    rows = []
    if args.seconds > 0:
        with tempfile.TemporaryDirectory(prefix="measure-bench-") as tmp:
            minutes = args.seconds / 60.0
            out = Path(tmp) / "compute"
            t0 = time.monotonic()
            collect_compute(args.tables, 100000, out, batch_size=args.batch_size, max_minutes=minutes)
            elapsed = (time.monotonic() - t0) / 60.0
            rows.append(_compute_row(load_compute_data(out), elapsed, f"compute ({read_meta(out)['config']['kernel']})"))
            for d in args.devices:
                out = Path(tmp) / f"comm{d}"
                t0 = time.monotonic()
                collect_comm(d, 100000, out, batch_size=args.batch_size, max_minutes=minutes)
                elapsed = (time.monotonic() - t0) / 60.0  # includes starting the D processes
                rows.append(_comm_row(load_comm_data(out), elapsed, f"comm D={d} (gloo)"))
    for folder in args.data:
        meta = read_meta(folder) or {}
        if meta.get("kind") == "compute":
            rows.append(_compute_row(load_compute_data(folder), None, f"data {folder}"))
        elif meta.get("kind") == "comm":
            rows.append(_comm_row(load_comm_data(folder), None, f"data {folder}"))
    table = pd.DataFrame(rows)
    print("measurements per minute and spread (cv: coefficient of variation of the timed repeats;"
          " median_ms: median cost, comm: median backward all-to-all)")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
