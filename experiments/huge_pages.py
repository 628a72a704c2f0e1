"""Does keeping the weights in transparent huge pages make a timing run quieter (issue 25)?

    python experiments/huge_pages.py --family criteo-terabyte --devices 8 --seed 167 --runs 4 [--processes]

Three plans of one task (NeuroShard's with ``--row-blocks any``, random, dim: the plans of
``device_composition.py``) are timed in ``--runs`` pairs of interleaved runs (``measure``'s
protocol), with and without huge pages in alternation: in one process (the timing run
advises its one weights buffer: ``kernels.advise_huge_pages``), or with ``--processes`` a
fresh process per run, started with PyTorch's ``THP_MEM_ALLOC_ENABLE=1`` (every allocation
of 2 MiB or more: the weights, the lookups, the pooled outputs and gradients) or without it
and without the advice. Per mode: each run's total
over all devices, each plan's slowest device, and how much a device moves between runs
(median coefficient of variation of its time, raw and as a share of its run's total, which
takes out the machine's speed of the moment). Output: experiments/results/huge_pages.txt.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_composition import add_task_arguments, task_plans

from neuroshard.constants import HUGE_PAGES_ENV
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.measure.store import cpu_model
from neuroshard.runtime.measure_plan import measure_plans

#: the plans of device_composition.py's default
PLANS = ("neuroshard", "random", "dim")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap, seed=167)
    ap.add_argument("--runs", type=int, default=4, help="runs per mode, alternating")
    ap.add_argument("--processes", action="store_true", help="a fresh process per run (PyTorch's environment variable)")
    ap.add_argument("--one", choices=("on", "off"), help=argparse.SUPPRESS)  # one run in this process, JSON out
    ap.add_argument("--out", default=None, help="default: experiments/results/huge_pages[_processes].txt")
    args = ap.parse_args()
    if args.processes and not args.one:
        return processes(args)
    logging.disable(logging.WARNING)
    models = load_cost_models(None)
    tables, _, plans = task_plans(args.family, args.devices, args.seed, PLANS, models)
    if args.one:
        result = measure_plans(plans, tables, cost_models=models, huge_pages=args.one == "on")
        print(json.dumps({"ms": [float(x) for p in result.plans for x in p.compute_ms],
                          "advised": result.config["huge_pages"]}))
        return
    runs: dict[bool, list[np.ndarray]] = {True: [], False: []}
    taken: dict[bool, list[bool]] = {True: [], False: []}
    for r in range(args.runs):
        for huge in ((True, False) if r % 2 == 0 else (False, True)):
            result = measure_plans(plans, tables, cost_models=models, huge_pages=huge)
            runs[huge].append(np.concatenate([p.compute_ms for p in result.plans]))
            taken[huge].append(result.config["huge_pages"])
            print(f"run {r} huge pages {huge}: total {runs[huge][-1].sum():.0f} ms", flush=True)
    report(args, runs, taken, list(plans), len(tables), "in one process (the weights buffer advised)")


def processes(args) -> None:
    """A fresh process per run, alternating: with PyTorch's huge-page allocation and the
    advice, or with neither."""
    runs: dict[bool, list[np.ndarray]] = {True: [], False: []}
    taken: dict[bool, list[bool]] = {True: [], False: []}
    for r in range(args.runs):
        for huge in ((True, False) if r % 2 == 0 else (False, True)):
            env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES_ENV}
            if huge:
                env[HUGE_PAGES_ENV] = "1"
            out = subprocess.run([sys.executable, __file__, "--family", args.family, "--devices", str(args.devices),
                                  "--seed", str(args.seed), "--one", "on" if huge else "off"],
                                 env=env, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            runs[huge].append(np.array(row["ms"]))
            taken[huge].append(row["advised"])
            print(f"run {r} huge pages {huge}: total {runs[huge][-1].sum():.0f} ms", flush=True)
    report(args, runs, taken, list(PLANS), None,
           f"a process per run ({HUGE_PAGES_ENV}=1 and the advice, or neither)")


def report(args, runs, taken, names, num_tables, how: str) -> None:
    tables_words = f", {num_tables} tables" if num_tables else ""
    lines = [f"# {args.family}, {args.devices} devices, seed {args.seed}{tables_words}, {len(names)} plans "
             f"({cpu_model()}); {args.runs} runs per mode, alternating, {how}",
             f"`python experiments/huge_pages.py --family {args.family} --devices {args.devices} --seed {args.seed} "
             f"--runs {args.runs}{' --processes' if args.processes else ''}`", ""]
    for huge in (True, False):
        a = np.array(runs[huge])
        share = a / a.sum(1, keepdims=True)
        cv_share = share.std(0, ddof=1) / share.mean(0)
        cv_raw = a.std(0, ddof=1) / a.mean(0)
        lines.append(f"huge pages {'on ' if huge else 'off'} (advice taken: {taken[huge]})")
        lines.append("  run totals (ms): " + ", ".join(f"{t:.0f}" for t in a.sum(1)))
        for i, name in enumerate(names):
            block = a[:, i * args.devices:(i + 1) * args.devices]
            lines.append(f"  {name:10s} slowest device per run (ms): " + ", ".join(f"{m:.1f}" for m in block.max(1)))
        lines.append(f"  a device between runs: median CV {100 * np.median(cv_raw):.1f}% raw, "
                     f"{100 * np.median(cv_share):.1f}% as a share of its run")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out or f"experiments/results/huge_pages{'_processes' if args.processes else ''}.txt")
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
