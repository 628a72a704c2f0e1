"""What refine's rebalance rounds estimated and measured, over stored plan-benchmark runs.

    python experiments/rebalance_records.py [RUN ...]

Reads every ``refine_*.json`` (``provenance.refine`` of the refined plan, written by
``plan_benchmark.py``) of the runs named (default: every ``plan_benchmark_issue25_session3*``
run under ``experiments/results``) and prints one row per rebalanced plan: the run, the plan
it came from, its kind (``full``, ``cut`` after its first changes, formats revision 26, or
``repacked``, revision 27), the number of changes, the anchor weight (revision 27), the
estimated change of the slowest device, and where it was timed the measured one against the
plan kept so far (the same runs), then which plan was kept. No timing: the runs' own records.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).resolve().parent / "results"


def rows(run: Path) -> list[dict]:
    out = []
    for path in sorted(run.glob("refine_*.json")):
        record = json.loads(path.read_text())
        rebalance = record.get("rebalance")
        if not rebalance:
            continue
        for p in rebalance["plans"]:
            kind = "repacked" if p.get("repacked") else "cut" if "cut_after" in p else "full"
            row = {"run": run.name.replace("plan_benchmark_issue25_", ""), "task": path.stem.replace("refine_", ""),
                   "round": p.get("round", 1), "from": p["from"], "kind": kind, "changes": p["changes"],
                   "anchor_weight": p.get("anchor_weight"),
                   "estimated": p["estimated_cost_after_ms"] / p["estimated_cost_before_ms"] - 1}
            against = p.get("against_ms", rebalance.get("chosen_measured_cost_ms"))  # session 32's first runs
            if "measured_cost_ms" in p and against:
                row["measured"] = p["measured_cost_ms"] / against - 1
                row["estimate_error"] = p["measured_cost_ms"] / p["estimated_cost_after_ms"] - 1
            row["kept"] = rebalance["kept"]
            row["run_noise"] = rebalance["fit"].get("run_noise")
            out.append(row)
    return out


def main(argv: list[str]) -> None:
    runs = [RESULTS / a for a in argv] if argv else sorted(RESULTS.glob("plan_benchmark_issue25_session3*"))
    table = pd.DataFrame([r for run in runs for r in rows(run)])
    if table.empty:
        print("no rebalance records in", ", ".join(str(r) for r in runs))
        return
    pd.set_option("display.width", 250)
    for column in ("estimated", "measured", "estimate_error"):
        if column in table:
            table[column] = (100 * table[column]).round(1)
    print("# python experiments/rebalance_records.py " + " ".join(argv))
    print("# estimated: % change of the slowest device against the plan it came from, by the anchored estimate;")
    print("# measured: % against the plan kept so far, timed in the same runs; estimate_error: measured over estimated")
    print(table.to_string(index=False))
    timed = table.dropna(subset=["measured"]) if "measured" in table else table.iloc[:0]
    if len(timed):
        print("\n# timed plans by kind: count, mean estimated %, mean measured %, mean estimate error %, "
              "how many measured below the plan kept")
        print(timed.groupby("kind").agg(n=("measured", "size"), estimated=("estimated", "mean"),
                                        measured=("measured", "mean"), error=("estimate_error", "mean"),
                                        cheaper=("measured", lambda m: int((m < 0).sum()))).round(1).to_string())


if __name__ == "__main__":
    main(sys.argv[1:])
