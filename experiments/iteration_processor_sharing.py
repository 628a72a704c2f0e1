"""Issue 31, from the stored iteration runs (no timing): does a processor-sharing walk of the
step explain what 3 ranks on 2 cores cost, plan by plan?

    python experiments/iteration_processor_sharing.py [--cores 2] [--capacity C ...] [--also SUITE RUN OPS.json]

The shipped model prices 3 ranks on a 2-core machine with overheads fitted at 3 ranks
(``fixed + scale x duration`` per term, and the period's stretch): the contention of ranks
taking turns on the cores, averaged over the fitted runs. Here the same contention is
simulated instead, with no parameter fitted at 3 ranks: each rank's operator durations get
the overheads fitted at ``min(ranks, cores)`` ranks (no rank waits for a core there), then
the step chain (``search.iteration.STEP_CHAIN``) is walked with the cores shared: while k
ranks have work and k > cores, each advances at cores / k of its own speed; a rank that
reached a collective waits without using a core; the collective's own duration is work
(``--collectives-wait``: it is not). A plan that leaves one rank idle then lets the other two
run at full speed, which the fitted average cannot see: the stored ranking sets where the
random plan measured fastest at 3 ranks (hot-few) are such plans.

Printed per variant: GMAE over all stored plans, at 2 and 3 ranks, per stored run at 3
ranks, and (right, wrong, ties) of the plan predicted fastest (``iteration_stored_ranking``'s
rule for a decided set).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans
from iteration_stored_ranking import RESULTS, RUNS, ranking

from neuroshard.costmodels import resolve_cost_models
from neuroshard.costmodels.dense import load_operator_models
from neuroshard.costmodels.metrics import gmae
from neuroshard.search.iteration import STEP_CHAIN, critical_path, operator_durations


def shared_walk(durations: list[dict[str, float]], cores: float, collectives_work: bool = True) -> float:
    """The period of the step chain when the ranks share ``cores`` (processor sharing; a
    fraction: cores that share memory bandwidth, caches or a physical core, see
    ``capacity_walk``)."""
    ranks = len(durations)
    clock = 0.0
    queues: list[list[list]] = [[] for _ in range(ranks)]

    def run() -> None:
        nonlocal clock
        while any(queues):
            active = [r for r in range(ranks) if queues[r]]
            rate = min(1.0, cores / len(active))
            dt = min(queues[r][0][1] for r in active) / rate
            clock += dt
            for r in active:
                queues[r][0][1] -= dt * rate
                if queues[r][0][1] <= 1e-12:
                    queues[r].pop(0)

    for term, collective in STEP_CHAIN:
        own = [d.get(term, 0.0) for d in durations]
        if collective is not None:
            run()  # everyone reaches the collective first
            if not collectives_work:
                clock += max(own)
                continue
        for r in range(ranks):
            if own[r] > 0:
                queues[r].append([term, own[r]])
        if collective is not None:
            run()
    run()
    return clock


def capacity_walk(durations: list[dict[str, float]], fitted_ranks: int, capacity: float,
                  collectives_work: bool = True) -> float:
    """The period when the machine's throughput is ``capacity`` ranks' worth (``capacity <
    fitted_ranks``: the busy ranks slow each other down through what they share), the
    ``durations`` being what a rank takes while ``fitted_ranks`` ranks are busy (the overheads
    were fitted there): a rank busy alone runs up to ``fitted_ranks / capacity`` times faster,
    which a plan leaving one rank idle gets and a balanced plan does not."""
    scale = capacity / fitted_ranks
    scaled = [{k: v * scale for k, v in d.items()} for d in durations]
    return shared_walk(scaled, capacity, collectives_work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, default=2, help="cores of the machine that ran the stored runs")
    ap.add_argument("--capacity", type=float, nargs="*", default=[],
                    help="also the variants 'capacity C' (capacity_walk): the machine's throughput C ranks' worth")
    ap.add_argument("--also", nargs=3, action="append", default=[], metavar=("SUITE", "RUN", "OPS"),
                    help="also this stored run (under experiments/results), predicted with its own operator costs")
    args = ap.parse_args()
    models, shipped = resolve_cost_models(None), load_operator_models(None)
    points = []
    runs = [(suite, run, shipped) for suite, run in RUNS]
    runs += [(suite, run, load_operator_models(ops)) for suite, run, ops in args.also]
    for suite, run, ops in runs:
        for config, tables, plan, row in stored_plans(suite, RESULTS / run / "configs.jsonl", models):
            durations, _ = operator_durations(plan, tables, models, ops, config[3], config[4])
            ranks = plan.num_devices
            variants = {}
            at_ranks, _ = ops.with_overheads(durations)
            variants["shipped (fitted at 3 ranks)"] = ops.with_period(critical_path(at_ranks)[2], ranks)
            unshared = min(ranks, args.cores)  # the overheads of rank counts no core is shared at
            at_cores, _ = ops.with_overheads(durations, ranks=unshared)
            for name, work in (("shared cores", True), ("shared cores, collectives wait", False)):
                variants[name] = ops.with_period(shared_walk(at_cores, args.cores, work), unshared)
            for capacity in args.capacity:
                variants[f"capacity {capacity:g}"] = ops.with_period(capacity_walk(at_cores, unshared, capacity),
                                                                      unshared)
            points.append({"run": run, "seed": config[2], "ranks": ranks, "plan": row["plan"],
                           "measured": row["measured_ms"], "run1": row["run1_ms"], "run2": row["run2_ms"],
                           "variants": variants})

    def gmae_pct(name: str, keep) -> float:
        """The GMAE (%) of variant ``name`` over the plans ``keep`` selects (nan: none)."""
        chosen = [p for p in points if keep(p)]
        if not chosen:
            return float("nan")
        return 100 * gmae(np.array([p["variants"][name] for p in chosen]), np.array([p["measured"] for p in chosen]))

    print(f"{len(points)} plans in {len({(p['run'], p['seed']) for p in points})} sets; GMAE against the "
          f"measured iteration, at 3 ranks per stored run")
    names = [run for _, run, _ in runs]
    print(f"{'variant':32s} {'all':>6s} {'2 ranks':>8s} {'3 ranks':>8s}  " + " ".join(f"{r[-12:]:>12s}" for r in names)
          + "  right/wrong/ties")
    for name in points[0]["variants"]:
        right, wrong, ties = ranking(points, lambda p, name=name: p["variants"][name])
        print(f"{name:32s} {gmae_pct(name, lambda p: True):5.1f}% {gmae_pct(name, lambda p: p['ranks'] == 2):7.1f}% "
              f"{gmae_pct(name, lambda p: p['ranks'] == 3):7.1f}%  "
              + " ".join(f"{gmae_pct(name, lambda p, r=r: p['run'] == r and p['ranks'] == 3):11.1f}%" for r in names)
              + f"  {right}/{wrong}/{ties}")
    for _, run, _ in args.also:
        print(f"\n{run} alone (its own operator costs): GMAE, right/wrong/ties")
        mine = [p for p in points if p["run"] == run]
        for name in mine[0]["variants"]:
            right, wrong, ties = ranking(mine, lambda p, name=name: p["variants"][name])
            print(f"  {name:32s} {gmae_pct(name, lambda p, run=run: p['run'] == run):5.1f}%  {right}/{wrong}/{ties}")

if __name__ == "__main__":
    main()
