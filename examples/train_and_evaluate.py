"""Train a plan on the included runtime and measure it beside a baseline plan.

    python examples/train_and_evaluate.py
    python examples/train_and_evaluate.py --runs 3 --iterations 20     # a tighter noise band

The runtime trains a DLRM (embeddings sharded as the plan says, dense MLPs replicated) in
one process per device over torch.distributed: gloo on CPUs, each process one device. Here
2 processes, small tables and a small batch, so a step takes a few milliseconds.

The comparison: our plan, a greedy baseline's (size-lookup) and our plan again (the A/A
control) take turns of a few steps in the same runs, so a slow spell of a shared machine
hits them alike. The A/A control's largest deviation is the noise band: a ratio inside it
is a tie. The same on the command line::

    neuroshard search tables.json -d 2 -m 64MiB -o plan.json
    neuroshard search tables.json -d 2 -m 64MiB -a size-lookup -o baseline.json
    neuroshard train plan.json --tables tables.json --batch-size 512 --steps 10
    neuroshard evaluate plan.json --tables tables.json --batch-size 512
    neuroshard demo          # the whole comparison against five baselines, with a figure
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import neuroshard
from neuroshard.runtime.evaluate import measure_alternating
from neuroshard.runtime.trainer import RunConfig, run


def small_tables() -> neuroshard.TableSet:
    """8 tables of 2,000 to 50,000 rows, 16 to 64 wide, 1 to 20 lookups per sample."""
    spec = [(50_000, 64, 1.0, 1.1), (20_000, 64, 20.0, 1.2), (30_000, 32, 8.0, 0.9), (10_000, 32, 4.0, 1.0),
            (5_000, 16, 2.0, 1.3), (40_000, 16, 1.0, 0.8), (2_000, 16, 10.0, 1.1), (8_000, 64, 3.0, 1.0)]
    tables = [neuroshard.Table(f"t{i}", rows, dim, lookups, {"zipf_alpha": zipf})
              for i, (rows, dim, lookups, zipf) in enumerate(spec)]
    return neuroshard.TableSet("small", tables, batch_size=512)  # the global batch: 256 per process


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--runs", type=int, default=2, help="measurement runs, all plans taking turns in each")
    parser.add_argument("--iterations", type=int, default=12, help="measured iterations per plan and run")
    parser.add_argument("--baseline", default="size-lookup", help="greedy baseline: size, dim, lookup, size-lookup")
    parser.add_argument("--out", type=Path, default=Path("out/examples/train_and_evaluate"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tables = small_tables()
    tables.write(args.out / "tables.json")

    # 1. Two plans for 2 devices: ours, and a greedy baseline's.
    plan = neuroshard.shard(tables, devices=2, memory="64MiB")
    baseline = neuroshard.shard(tables, devices=2, memory="64MiB", algorithm=args.baseline)
    plan.write(args.out / "plan.json")
    baseline.write(args.out / f"plan-{args.baseline}.json")
    print(plan.format_summary())

    # 2. Train with our plan: 2 processes, the loss of every step (rank 0 reports).
    result = run(RunConfig(plan, list(tables), world_size=2, steps=args.steps, batch_size=tables.batch_size))
    print(f"\ntrained {args.steps} steps on {result.world_size} {result.backend} processes (kernel {result.kernel}); "
          f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}")

    # 3. Measure: ours, the baseline's and ours again (A/A) taking turns in each run.
    plans = {"neuroshard": plan, args.baseline: baseline, "neuroshard again": plan}
    runs = measure_alternating(plans, tables, runs=args.runs, iterations=args.iterations, devices=2,
                               batch_size=tables.batch_size)
    cost = {name: [m.max_device_cost_ms for m in measured] for name, measured in runs.items()}
    for name, values in cost.items():
        print(f"  {name:<16} slowest device per run: {', '.join(f'{v:.3f}' for v in values)} ms")
    ratios = [ours / theirs for ours, theirs in zip(cost["neuroshard"], cost[args.baseline])]
    control = [again / ours for again, ours in zip(cost["neuroshard again"], cost["neuroshard"])]
    ratio = geometric_mean(ratios)
    band = max(abs(c - 1.0) for c in control + [geometric_mean(control)])
    verdict = ("a tie (inside the noise band)" if abs(ratio - 1.0) <= band else
               "ours is faster" if ratio < 1.0 else "the baseline is faster")
    same = " (the two plans are the same)" if plan.layout_key() == baseline.layout_key() else ""
    print(f"\nmeasured: our plan's slowest device at {ratio:.3f}x {args.baseline}'s{same}, A/A noise band "
          f"+-{100 * band:.1f}% over {args.runs} runs: {verdict}")


if __name__ == "__main__":
    main()
