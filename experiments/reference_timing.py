"""Does a reference kernel timed beside every device turn cancel the machine's phases?

    python experiments/reference_timing.py --family criteo-kaggle --devices 8 --runs 4

A task of ``--family`` (``datasets.families.family_tasks``, 8-12 tables per device, seed
``--seed``, task ``--task``) is planned by measured-greedy, lookup, size-lookup, dim and
random (one host), and measured-greedy's plan is timed a second time as an A/A control.
Each run times all devices of all plans in one interleaved run with ``neuroshard measure``'s
protocol (``KernelBenchmark.time_fused``: a cache flush before every run, the median of a
pass's runs, passes of about ``TIMING_MIN_PASS_MS``, turns rotated every pass), and right
before every device's turn it times one fixed reference device (the lookup plan's first
device; a quarter of its sized runs). Per run it prints the A/A ratio of the max device and
every plan's max device over measured-greedy's, for four figures per device: the fastest
pass (what ``measure`` reports), the median pass, and the same two of the device's time
divided by the reference's beside it. If the machine's speed moves in phases (frequency,
a neighbour on the other core), the ratios cancel it and the A/A of "relative" figures is
the tighter one; the last lines give each figure's mean |log A/A| over the runs.

It chose the instrument's figure (docs/decisions.md#reference-device): ``time_devices``
times a reference before every turn and reports the "relative median" (with a reference of
its own choosing, the device of median work, and its level at the reference's fastest
turn). This script keeps its own loop because it needs the raw and the relative passes of
one run side by side, which ``time_devices`` does not return.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from common import RESULTS, write_source

from neuroshard.constants import DEFAULT_MAX_ROWS, TIMING_MAX_REPEATS, TIMING_MIN_PASS_MS, TIMING_REPEATS
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.samples.kernel import KernelBenchmark
from neuroshard.costmodels.samples.store import cpu_model
from neuroshard.costmodels.samples.timing import _build, _device_times, _sized_runs, weights_numel
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.execution.kernels import resolve_kernel
from neuroshard.search.api import search_plan
from neuroshard.topology import Topology

PLANS = ("measured-greedy", "lookup", "size-lookup", "dim", "random")
FIGURES = {
    "fastest": lambda raw, rel: raw.min(),
    "median": lambda raw, rel: np.median(raw),
    "relative fastest": lambda raw, rel: rel.min(),
    "relative median": lambda raw, rel: np.median(rel),
}


def _build_and_size(dt, kernel: str, buffer: torch.Tensor, bench: KernelBenchmark) -> None:
    """The device's kernel built, run once untimed and sized, as ``time_devices`` does."""
    _build(dt, kernel, torch.device("cpu"), "exact_sgd", buffer)
    dt.repeats = _sized_runs(bench, dt, TIMING_REPEATS, TIMING_MIN_PASS_MS, TIMING_MAX_REPEATS)


def one_run(plans: dict, tables, devices: int, passes: int, batch: int) -> dict[str, dict[str, float]]:
    """Per figure, per plan: its max device."""
    kernel = resolve_kernel("auto", "cpu")
    bench = KernelBenchmark(backend="cpu", kernel=kernel, batch_size=batch, max_rows=DEFAULT_MAX_ROWS, warmup=0,
                            repeats=TIMING_REPEATS, max_repeats=TIMING_REPEATS)
    turns = [(name, d, _device_times(plan.shards_on(d), tables, batch, DEFAULT_MAX_ROWS))
             for name, plan in plans.items() for d in range(devices) if plan.shards_on(d)]
    reference = _device_times(plans["lookup"].shards_on(0), tables, batch, DEFAULT_MAX_ROWS)
    buffer = torch.full((max(weights_numel(dt.shapes, kernel) for *_, dt in turns),), 0.01)
    _build_and_size(reference, kernel, buffer, bench)
    raw = {(n, d): [] for n, d, _ in turns}
    rel = {(n, d): [] for n, d, _ in turns}
    for p in range(passes):
        shift = (p * max(1, len(turns) // passes)) % len(turns)
        for name, d, dt in turns[shift:] + turns[:shift]:
            if getattr(dt, "fused", None) is None:
                _build_and_size(dt, kernel, buffer, bench)
            ref_ms = bench.time_fused(reference.fused, reference.prepared, max(TIMING_REPEATS, reference.repeats // 4)).cost_ms
            ms = bench.time_fused(dt.fused, dt.prepared, dt.repeats).cost_ms
            raw[(name, d)].append(ms)
            rel[(name, d)].append(ms / ref_ms)
    return {figure: {name: max(f(np.array(raw[(n, d)]), np.array(rel[(n, d)])) for n, d, _ in turns if n == name)
                     for name in plans} for figure, f in FIGURES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="criteo-kaggle", choices=sorted(FAMILIES))
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--seed", type=int, default=127)
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS / "reference_timing",
                        help="folder of output.txt (what is printed) and SOURCE.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_source(args.out)
    lines = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    models = load_cost_models(None)
    tables, memory = family_tasks(args.family, args.devices, args.task + 1, (8, 12), seed=args.seed)[args.task]
    topology = Topology(args.devices, local_world_size=args.devices)
    plans = {a: search_plan(tables, devices=args.devices, memory=memory, algorithm=a, cost_models=models, seed=0,
                            topology=topology) for a in PLANS}
    plans["control"] = plans["measured-greedy"]
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    say(f"{args.family}, {args.devices} devices, seed {args.seed} task {args.task} ({len(tables)} tables), "
          f"{args.passes} passes, {cpu_model()}")
    aa = {figure: [] for figure in FIGURES}
    for run in range(args.runs):
        start = time.perf_counter()
        result = one_run(plans, tables, args.devices, args.passes, models.batch_size)
        say(f"run {run + 1} ({time.perf_counter() - start:.0f} s)")
        for figure, maxima in result.items():
            base = maxima["measured-greedy"]
            aa[figure].append(maxima["control"] / base)
            say(f"  {figure:17s} A/A {aa[figure][-1]:.3f}   over measured-greedy: "
                  + " ".join(f"{n} {maxima[n] / base:.3f}" for n in PLANS[1:]))
    for figure, ratios in aa.items():
        logs = np.abs(np.log(ratios))
        say(f"{figure:17s} mean |log A/A| {100 * logs.mean():.1f}%, worst {100 * logs.max():.1f}% over {len(ratios)} runs")
    (args.out / "output.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
