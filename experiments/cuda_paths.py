"""The CUDA paths on a real GPU: the runtime on NCCL, estimate against evaluate, plans timed on the GPU.

    python experiments/cuda_paths.py --out DIR          # on a machine with one CUDA GPU (about 6 minutes)

Until this script, the CUDA code paths (the kernel benchmark on CUDA events, the runtime on
NCCL with the embeddings on the GPU) were written but had never run: the project's machine
has no GPU. Steps, each run on its own and reported with its exit status, so one failure
does not hide the others:

1. ``train`` and ``evaluate`` a one-device plan of 16 dlrm-2021 tables on one GPU (NCCL,
   one process: a one-GPU machine cannot run two NCCL ranks), and ``estimate`` the same
   plan with the shipped (CPU-measured) iteration-time model: how far a CPU model is from
   a GPU step, term by term.
2. The plans of NeuroShard (searched with the shipped CPU checkpoint) and of the greedy
   baselines for held-out tasks, every device timed on the GPU (``measure_plans`` with
   ``backend="cuda"``: CUDA events, the devices of all plans taking turns), as ratios to
   the best baseline: does a plan searched for this CPU transfer to a GPU?
3. ``collect compute --device cuda``: GPU cost data (random shard sets) from which
   ``neuroshard pretrain`` builds a GPU checkpoint.

Everything lands in ``--out``; ``summary.txt`` holds the printed tables.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run(cmd: list[str], log: Path, timeout: int) -> int:
    """One CLI step, its output appended to ``log``; its exit status (124: timed out)."""
    start = time.time()
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    print(f"[rc {rc}, {time.time() - start:.0f} s] {' '.join(cmd[3:6])} ...", flush=True)
    return rc


def plans_on_gpu(out: Path, families: list[str], devices: int, passes: int) -> list[dict]:
    """Step 2: plans searched with the shipped checkpoint, timed device by device on the GPU."""
    from neuroshard.costmodels import load_cost_models
    from neuroshard.datasets.families import family_tasks
    from neuroshard.runtime.measure_plan import measure_plans
    from neuroshard.search.api import shard
    from neuroshard.search.registry import GREEDY_ALGORITHMS
    from neuroshard.topology import Topology

    models = load_cost_models()
    rows = []
    for family in families:
        tables, memory = family_tasks(family, devices, 1, tables_per_device=(8, 12), seed=31)[0]
        tables.batch_size = models.batch_size
        topology = Topology(devices, local_world_size=devices)
        plans = {a: shard(tables, devices, memory, algorithm=a, cost_models=models, topology=topology)
                 for a in ("neuroshard", *GREEDY_ALGORITHMS) if a != "random"}
        plans["A/A size-lookup again"] = plans["size-lookup"]
        result = measure_plans(plans, tables, cost_models=models, passes=passes, backend="cuda",
                               row_cap=4_000_000, warmup_passes=1)
        (out / f"measured-{family}.txt").write_text(result.format() + "\n")
        best = min(p.max_compute_ms for p in result.plans if p.name not in ("neuroshard", "A/A size-lookup again"))
        for p in result.plans:
            rows.append({"family": family, "devices": devices, "plan": p.name,
                         "max_compute_ms": round(p.max_compute_ms, 4),
                         "ratio_to_best_baseline": round(p.max_compute_ms / best, 4),
                         "total_compute_ms": round(float(sum(p.compute_ms)), 4)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", nargs="+", default=["criteo-terabyte", "dlrm-2021"])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--samples", type=int, default=600, help="random shard sets of step 3")
    parser.add_argument("--skip", nargs="*", default=[], choices=["runtime", "plans", "collect"])
    args = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: this script is for a GPU machine", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    summary = [f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
               f"fbgemm_gpu: {'yes' if _has_fbgemm() else 'no (kernel: torch.nn.EmbeddingBag)'}"]
    print(summary[0], flush=True)
    cli = [sys.executable, "-m", "neuroshard.cli"]
    status = {}
    if "runtime" not in args.skip:
        t, p = str(out / "tables.json"), str(out / "plan-1gpu.json")
        status["generate"] = run(cli + ["tables", "generate", "--preset", "dlrm-2021", "--num-tables", "16",
                                        "--seed", "1", "-o", t], log, 120)
        status["search"] = run(cli + ["search", t, "-d", "1", "-m", "100GiB", "-o", p], log, 120)
        status["train"] = run(cli + ["train", p, "--tables", t, "--dist-backend", "nccl", "--steps", "10"], log, 240)
        status["evaluate"] = run(cli + ["evaluate", p, "--tables", t, "--dist-backend", "nccl", "--iterations", "30",
                                        "-o", str(out / "evaluate.json")], log, 240)
        status["estimate"] = run(cli + ["estimate", p, "--tables", t, "-o", str(out / "estimate.json")], log, 120)
        if status["evaluate"] == 0 and status["estimate"] == 0:
            measured = json.loads((out / "evaluate.json").read_text())
            predicted = json.loads((out / "estimate.json").read_text())
            summary.append(f"one-GPU step: measured {measured.get('iteration_ms')} ms (evaluate, NCCL), "
                           f"CPU iteration model's estimate {predicted.get('iteration_ms')} ms")
            for term in sorted(set(measured.get("breakdown", {})) | set(predicted.get("breakdown", {}))):
                summary.append(f"  {term}: measured {measured.get('breakdown', {}).get(term)}, "
                               f"estimated {predicted.get('breakdown', {}).get(term)}")
    if "plans" not in args.skip:
        try:
            rows = plans_on_gpu(out, args.families, args.devices, args.passes)
            status["plans"] = 0
            summary.append("plans timed on the GPU (max device compute over the best greedy baseline's):")
            summary += [f"  {r['family']:<16} {r['plan']:<22} max {r['max_compute_ms']:9.3f} ms  "
                        f"ratio {r['ratio_to_best_baseline']:.3f}  total {r['total_compute_ms']:9.3f} ms" for r in rows]
            (out / "plans.json").write_text(json.dumps(rows, indent=1) + "\n")
        except Exception as exc:  # report and go on: the other steps still tell something
            status["plans"] = 1
            summary.append(f"plans on the GPU failed: {type(exc).__name__}: {exc}")
    if "collect" not in args.skip:
        status["collect"] = run(cli + ["collect", "compute", "--device", "cuda", "--samples", str(args.samples),
                                       "--max-tables-per-device", "40", "-o", str(out / "gpu-compute")], log, 300)
    summary.append("exit status per step: " + ", ".join(f"{k} {v}" for k, v in status.items()))
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    return 0 if all(v == 0 for v in status.values()) else 1


def _has_fbgemm() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401
        return True
    except Exception:
        return False


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
