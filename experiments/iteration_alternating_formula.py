"""What a run whose steps alternate between plans measures, predicted (issue 31, session 40; no timing).

    python experiments/iteration_alternating_formula.py two-process \
        experiments/results/iteration_two_process/configs.jsonl experiments/results/iteration_two_process/cpu-operators.json

Before formats revision 32, plans measured together alternated every step, and a step's barrier
waited for the previous step's plan: the period of plan P measured after plan Q is
``max_r(post_Q[r] + input_P[r]) - mean_r post_Q[r] + mean_r post_P[r]`` (``post`` a rank's work
from the barrier to the step's end). Each stored plan is predicted both ways, the steady step (the
model) and this formula averaged over the run's two orders, against what the alternating run
measured: GMAE and the ranking (the benchmark's rule) of each.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans

from neuroshard.costmodels import resolve_cost_models
from neuroshard.costmodels.dense import load_operator_models
from neuroshard.costmodels.metrics import gmae
from neuroshard.search.iteration import estimate_iteration

BEFORE_BARRIER = {"input_ms", "sync_ms", "other_ms"}


def main() -> None:
    suite, results, operator_costs = sys.argv[1:4]
    models, ops = resolve_cost_models(None), load_operator_models(operator_costs)
    by_set: dict = {}
    for config, tables, plan, row in stored_plans(suite, results, models):
        est = estimate_iteration(plan, tables, models, ops, config[3], config[4])
        post = np.array([sum(v for k, v in r.items() if k not in BEFORE_BARRIER) for r in est.per_rank])
        inp = np.array([r["input_ms"] + r.get("other_ms", 0.0) for r in est.per_rank])
        by_set.setdefault(config[2], []).append((row, est.iteration_ms, post, inp))
    steady_all, alternating_all, measured_all = [], [], []
    score = {"steady": [0, 0, 0], "alternating": [0, 0, 0]}
    for seed, rows in by_set.items():
        names = [r[0]["plan"] for r in rows]

        def alternating(order, rows=rows, names=names):
            out = {}
            for i, name in enumerate(order):
                p, q = rows[names.index(name)], rows[names.index(order[i - 1])]
                rest = p[1] - np.max(p[2] + p[3])  # what the steady period adds besides post and input
                out[name] = np.max(q[2] + p[3]) - q[2].mean() + p[2].mean() + rest
            return out

        a, b = alternating(names), alternating(names[::-1])
        print(f"seed {seed}")
        for row, steady, _, _ in rows:
            name = row["plan"]
            steady_all.append(steady)
            alternating_all.append(0.5 * (a[name] + b[name]))
            measured_all.append(row["measured_ms"])
            print(f"  {name:12s} measured {row['measured_ms']:6.1f}  steady {steady:6.1f}  "
                  f"alternating {0.5 * (a[name] + b[name]):6.1f} ms")
        measured = {r[0]["plan"]: r[0]["measured_ms"] for r in rows}
        noise = float(np.median([abs(np.log(r[0]["run1_ms"] / r[0]["run2_ms"])) for r in rows]))
        order = sorted(measured, key=measured.get)
        tie = np.log(measured[order[1]] / measured[order[0]]) < noise
        for key, pred in (("steady", {r[0]["plan"]: r[1] for r in rows}),
                          ("alternating", {n: 0.5 * (a[n] + b[n]) for n in names})):
            score[key][2 if tie else (0 if min(pred, key=pred.get) == order[0] else 1)] += 1
    measured_all = np.array(measured_all)
    print(f"GMAE steady {100 * gmae(np.array(steady_all), measured_all):.1f}%, "
          f"alternating {100 * gmae(np.array(alternating_all), measured_all):.1f}%")
    print(f"right, wrong, ties: {score}")


if __name__ == "__main__":
    main()
