"""How search time, peak memory and plan quality grow with tables x devices: the search at scale.

For each size, ``dlrm-2021`` tables (``neuroshard tables generate --preset dlrm-2021``) are
planned on devices of 80 GiB in hosts of 8 (``Topology(local_world_size=8)``) by each
algorithm, every search in its own process so that its peak resident memory is its own.
Printed per run: wall seconds of the search (``search_plan``: checks, search, plan), peak RSS in
GB of that process, and the plan's estimated ratio to its balanced bound; then, per size,
NeuroShard's estimate against size-lookup's. A figure (seconds against tables x devices,
log-log) is written beside the table.

    python experiments/scaling_benchmark.py --sizes 1000x64 10000x512 10000x1024 50000x1024 50000x4096
    python experiments/scaling_benchmark.py --sizes 1000x64 10000x1024 --algorithms neuroshard

Sizes default to 1k/10k/50k tables x 64/512/1,024/4,096 devices; a run is skipped (and
said so) when the previous size of the same algorithm took longer than ``--budget-s``.
The CPU model is recorded beside the figures (``rows.json``, ``SOURCE.json``): the time depends on it.
Results go to ``--out`` (default ``experiments/results/search_at_scale``).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from common import write_source

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = [f"{t}x{d}" for t in (1000, 10000, 50000) for d in (64, 512, 1024, 4096)]

_CHILD = r"""
import json, resource, sys, time
from neuroshard.search.api import search_plan
from neuroshard.tables import TableSet
from neuroshard.topology import Topology
path, devices, algorithm = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tables = TableSet.read(path)
start = time.perf_counter()
plan = search_plan(tables, devices=devices, memory="80GiB", algorithm=algorithm,
                   topology=Topology(devices, local_world_size=8))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  "ratio": plan.estimate["ratio_to_balanced_bound"],
                  "max_ms": plan.estimate["max_device_cost_ms"], "shards": len(plan.shards)}))
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def tables_file(folder: Path, num_tables: int) -> Path:
    path = folder / f"dlrm-2021-{num_tables}.json"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "neuroshard.cli", "tables", "generate", "--preset", "dlrm-2021",
                        "--num-tables", str(num_tables), "--calibration-tables", "0", "-o", str(path)],
                       check=True, capture_output=True, cwd=ROOT)
    return path


def run_one(path: Path, devices: int, algorithm: str, timeout: float) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(devices), algorithm],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="TABLESxDEVICES, e.g. 10000x1024")
    ap.add_argument("--algorithms", nargs="+", default=["neuroshard", "size-lookup"])
    ap.add_argument("--budget-s", type=float, default=600.0, help="skip larger sizes of an algorithm after a run "
                                                                   "this long; also each run's time limit x 2")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "search_at_scale")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_source(args.out)
    rows, stop = [], set()
    print(f"CPU: {cpu_model()}; dlrm-2021 tables, 80 GiB devices, hosts of 8")
    print(f"{'tables':>7} {'devices':>7} {'algorithm':>12} {'seconds':>8} {'peak GB':>8} {'ratio':>7}")
    for size in args.sizes:
        num_tables, devices = (int(x) for x in size.lower().split("x"))
        path = tables_file(args.out, num_tables)
        for algorithm in args.algorithms:
            if algorithm in stop:
                row = {"error": "skipped: a smaller size took over the budget"}
            else:
                start = time.perf_counter()
                row = run_one(path, devices, algorithm, 2 * args.budget_s)
                if time.perf_counter() - start > args.budget_s:
                    stop.add(algorithm)
            row.update(tables=num_tables, devices=devices, algorithm=algorithm)
            rows.append(row)
            if "error" in row:
                print(f"{num_tables:>7} {devices:>7} {algorithm:>12} {row['error']}")
            else:
                print(f"{num_tables:>7} {devices:>7} {algorithm:>12} {row['seconds']:>8.1f} {row['peak_gb']:>8.2f} "
                      f"{row['ratio']:>7.4f}", flush=True)
    (args.out / "rows.json").write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1) + "\n")
    by_size: dict[tuple[int, int], dict[str, dict]] = {}
    for row in rows:
        by_size.setdefault((row["tables"], row["devices"]), {})[row["algorithm"]] = row
    print("\nNeuroShard's estimate against size-lookup's (max device ms):")
    for (t, d), runs in by_size.items():
        ours, base = runs.get("neuroshard", {}), runs.get("size-lookup", {})
        if "max_ms" in ours and "max_ms" in base:
            print(f"  {t} x {d}: {ours['max_ms'] / base['max_ms']:.4f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for algorithm in args.algorithms:
            done = [r for r in rows if r["algorithm"] == algorithm and "seconds" in r]
            ax.loglog([r["tables"] * r["devices"] for r in done], [r["seconds"] for r in done], "o-", label=algorithm)
        ax.set_xlabel("tables x devices")
        ax.set_ylabel("search seconds")
        ax.set_title(f"search time ({cpu_model()[:40]})", fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "scaling.png", dpi=120)
        print(f"figure: {args.out / 'scaling.png'}")
    except ImportError:
        print("matplotlib missing: no figure")


if __name__ == "__main__":
    main()
