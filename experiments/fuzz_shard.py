"""Fuzz ``neuroshard.shard`` over random tasks (issue 14).

Each case draws tables, a device count and a memory size around the tables' total
(from 10% short to 40% spare, some with one table larger than a device), then asserts:

* the search returns a valid plan, or raises a ``NeuroShardError`` whose message is one line;
* it returns a plan whenever one of the shipped greedy baselines finds one (a search
  never refuses a task a baseline can plan).

    .venv/bin/python experiments/fuzz_shard.py --cases 1000

The test suite runs a short seeded loop of the same cases (tests/test_bad_inputs.py).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import neuroshard
from neuroshard.errors import NeuroShardError
from neuroshard.tables import Table, TableSet


def random_task(seed: int) -> tuple[TableSet, int, int]:
    """(tables, devices, memory bytes) of case ``seed``."""
    rng = np.random.default_rng([14, seed])
    n = int(rng.integers(1, 25))
    tables = []
    for i in range(n):
        dim = int(rng.choice([4, 8, 12, 16, 24, 32, 64, 96, 128, 256])) if rng.random() < 0.9 \
            else int(rng.integers(1, 200))
        rows = int(10 ** rng.uniform(1, 6.3))
        access = {"zipf_alpha": round(float(rng.uniform(0.0, 1.4)), 3)} if rng.random() < 0.6 else {}
        tables.append(Table(f"t{i}", rows, dim, round(float(rng.uniform(0.0, 40.0)), 3), access))
    ts = TableSet(f"fuzz{seed}", tables, batch_size=int(rng.choice([256, 1024, 4096])))
    devices = int(rng.integers(1, 9))
    total = ts.total_bytes()
    kind = rng.random()
    if kind < 0.6:  # tight: 0-5% headroom
        memory = total / devices * (1.0 + rng.uniform(0.0, 0.05))
    elif kind < 0.9:
        memory = total / devices * (1.0 + rng.uniform(0.05, 0.4))
    else:  # some infeasible ones
        memory = total / devices * rng.uniform(0.9, 1.0)
    return ts, devices, max(int(memory), 64)


def check_case(seed: int, models) -> str:
    """'plan', 'refused' (no baseline plans it either) or raises AssertionError."""
    from neuroshard.constraints import check_capacity
    from neuroshard.search.baselines import best_packing_greedy
    from neuroshard.search.simulator import Simulator
    tables, devices, memory = random_task(seed)
    try:
        plan = neuroshard.shard(tables, devices=devices, memory=memory, cost_models=models)
    except NeuroShardError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"case {seed}: message is not one line: {message!r}"
        try:  # the baselines as shipped: behind the same feasibility check as every algorithm
            check_capacity(tables, devices, memory, 4)
            baseline = best_packing_greedy(Simulator(tables, devices, models), memory)
        except NeuroShardError:
            baseline = None
        assert baseline is None, (f"case {seed}: refused ({message}) but the {baseline.details['fallback']['algorithm']} "
                                  f"baseline plans it")
        if tables.total_bytes() <= devices * memory:
            return "refused (fits by total bytes; no baseline packs it either)"
        return "refused (over capacity)"
    assert not plan.problems(), f"case {seed}: invalid plan {plan.problems()[:2]}"
    assert max(plan.memory_used_bytes()) <= memory
    return "plan"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    args = parser.parse_args(argv)
    from neuroshard.costmodels import load_cost_models
    models = load_cost_models()
    counts: dict[str, int] = {}
    failures = []
    started = time.perf_counter()
    for seed in range(args.start, args.start + args.cases):
        try:
            outcome = check_case(seed, models)
        except AssertionError as exc:
            outcome = "FAILED"
            failures.append(str(exc))
            print(exc, flush=True)
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome.startswith("refused (fits"):
            tables, devices, memory = random_task(seed)
            print(f"case {seed}: {outcome}: {len(tables)} tables on {devices} devices, "
                  f"{tables.total_bytes() / (devices * memory):.4f} of capacity", flush=True)
    print(f"{args.cases} cases in {time.perf_counter() - started:.0f} s: "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
