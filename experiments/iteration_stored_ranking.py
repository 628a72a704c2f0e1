"""Issue 31, item 6, from the stored iteration runs (no timing): is the plan predicted fastest the
one measured fastest, and would a work-conserving bound for ranks sharing cores help?

    python experiments/iteration_stored_ranking.py [--operator-costs OPS.json] [--cores 2]

Every stored run of `iteration_benchmark.py` (their `configs.jsonl`) is predicted again with
the shipped models (plans made again: `iteration_benchmark.stored_plans`). A set is *decided*
when its fastest plan was fastest in both runs and its lead over the second is at least the
set's A/A noise (the median |log(run 1 / run 2)| of its plans); the rest are ties. For
configurations with more ranks than ``--cores``, the alternative prediction is
``max(prediction, k x the ranks' own work (no collective, no barrier) / cores)``: the
ranks taking turns on the cores cannot finish sooner than their work shared over them.
Printed: GMAE and (right, wrong, ties) for the shipped prediction and for each k.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans

from neuroshard.costmodels import resolve_cost_models
from neuroshard.costmodels.dense import load_operator_models
from neuroshard.costmodels.metrics import gmae, ratio_error
from neuroshard.search.iteration import STEP_CHAIN, estimate_iteration

RESULTS = Path(__file__).resolve().parent / "results"
#: (suite, stored run) of every iteration run kept in experiments/results
RUNS = [("default", "iteration"), ("embedding-heavy", "iteration_ranking"), ("fresh", "iteration_fresh"),
        ("default", "iteration_with_random"), ("default", "iteration_sameday/default"),
        ("embedding-heavy", "iteration_sameday/embedding-heavy"), ("fresh", "iteration_sameday/fresh")]
#: a rank's own work: the terms no collective ends (the estimate's collectives carry waiting)
OWN_TERMS = {term for term, collective in STEP_CHAIN if collective is None}


def ranking(points: list[dict], key) -> tuple[int, int, int]:
    """(right, wrong, ties) over the sets of ``points``, the plan predicted fastest by ``key``."""
    sets = defaultdict(list)
    for p in points:
        sets[(p["run"], p["seed"])].append(p)
    right = wrong = ties = 0
    for plans in sets.values():
        noise = float(np.median([abs(np.log(p["run1"] / p["run2"])) for p in plans]))
        order = sorted(plans, key=lambda p: p["measured"])
        first, rest = order[0], order[1:]
        agree = first["run1"] < min(p["run1"] for p in rest) and first["run2"] < min(p["run2"] for p in rest)
        if agree and np.log(rest[0]["measured"] / first["measured"]) >= noise:
            if min(plans, key=key)["plan"] == first["plan"]:
                right += 1
            else:
                wrong += 1
        else:
            ties += 1
    return right, wrong, ties


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--operator-costs", default=None, help="operator cost models (default: the shipped ones)")
    ap.add_argument("--cores", type=int, default=2, help="cores of the machine that ran the stored runs")
    args = ap.parse_args()
    models = resolve_cost_models(None)
    ops = load_operator_models(args.operator_costs)
    points = []
    for suite, run in RUNS:
        for config, tables, plan, row in stored_plans(suite, RESULTS / run / "configs.jsonl", models):
            model, batch = config[3], config[4]
            estimate = estimate_iteration(plan, tables, models, ops, model, batch)
            own = sum(v for rank in estimate.per_rank for k, v in rank.items() if k in OWN_TERMS)
            points.append({"run": run, "seed": config[2], "ranks": plan.num_devices, "plan": row["plan"],
                           "predicted": estimate.iteration_ms, "measured": row["measured_ms"],
                           "run1": row["run1_ms"], "run2": row["run2_ms"], "own": own})
    measured = np.array([p["measured"] for p in points])
    print(f"{len(points)} plans in {len({(p['run'], p['seed']) for p in points})} sets")

    def report(name, key):
        predicted = np.array([key(p) for p in points])
        right, wrong, ties = ranking(points, key)
        print(f"{name:28s} GMAE {100 * gmae(predicted, measured):5.1f}% (ratio error "
              f"{100 * ratio_error(predicted, measured):4.1f}%)   right {right}, wrong {wrong}, ties {ties}")

    report("shipped", lambda p: p["predicted"])
    for k in (0.8, 1.0, 1.2, 1.4):
        report(f"work-conserving bound k={k}",
               lambda p, k=k: max(p["predicted"], k * p["own"] / args.cores) if p["ranks"] > args.cores else p["predicted"])


if __name__ == "__main__":
    main()
