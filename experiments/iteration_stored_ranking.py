"""Issue 31, item 6, from the stored iteration runs (no timing): is the plan predicted fastest the
one measured fastest, and would a work-conserving bound for ranks sharing cores help?

    python experiments/iteration_stored_ranking.py [--operator-costs OPS.json] [--cores 2]
    python experiments/iteration_stored_ranking.py --turns     # the runs measured in turns (session 40)

Every stored run of `iteration_benchmark.py` (their `configs.jsonl`) is predicted again with
the shipped models (plans made again: `iteration_benchmark.stored_plans`). Runs before session
40 measured the plans of a set with their steps alternating one by one, which charged a plan's
waiting to the next plan's step (formats revision 32); ``--turns`` takes the runs measured in
turns instead (``TURN_RUNS``), predicted with the operator file measured that session on their
machine (``TURN_OPERATORS``), and prints each run apart too. A set is *decided*
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
from neuroshard.measured.judge import geometric_mean
from neuroshard.search.iteration import STEP_CHAIN, estimate_iteration

RESULTS = Path(__file__).resolve().parent / "results"
#: (suite, stored run) of every iteration run kept in experiments/results
RUNS = [("default", "iteration"), ("embedding-heavy", "iteration_ranking"), ("fresh", "iteration_fresh"),
        ("default", "iteration_with_random"), ("default", "iteration_sameday/default"),
        ("embedding-heavy", "iteration_sameday/embedding-heavy"), ("fresh", "iteration_sameday/fresh")]
#: the runs measured in turns of 3 steps (formats revision 32; session 40, AMD EPYC family 25 model 17)
TURN_RUNS = [("turns", "iteration_turns/turns"), ("two-process", "iteration_turns/two-process"),
             ("embedding-heavy", "iteration_turns/embedding-heavy"), ("turns-two", "iteration_turns/turns-two"),
             ("with-measured", "iteration_turns/with-measured"),  # session 41: measured-greedy in every set
             ("with-measured-two", "iteration_turns/with-measured-two")]
#: the operator costs measured (collect dense, then collect overheads in turns) before those runs
TURN_OPERATORS = RESULTS / "iteration_turns" / "cpu-operators.json"
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
    ap.add_argument("--turns", action="store_true", help="the runs measured in turns (session 40; TURN_RUNS)")
    args = ap.parse_args()
    models = resolve_cost_models(None)
    runs = [r for r in TURN_RUNS if (RESULTS / r[1] / "configs.jsonl").exists()] if args.turns else RUNS
    ops = load_operator_models(args.operator_costs or (TURN_OPERATORS if args.turns else None))
    points = []
    for suite, run in runs:
        for config, tables, plan, row in stored_plans(suite, RESULTS / run / "configs.jsonl", models):
            model, batch = config[3], config[4]
            estimate = estimate_iteration(plan, tables, models, ops, model, batch)
            own = sum(v for rank in estimate.per_rank for k, v in rank.items() if k in OWN_TERMS)
            points.append({"run": run, "seed": config[2], "ranks": plan.num_devices, "plan": row["plan"],
                           "predicted": estimate.iteration_ms, "measured": row["measured_ms"],
                           "run1": row["run1_ms"], "run2": row["run2_ms"], "own": own})
    print(f"{len(points)} plans in {len({(p['run'], p['seed']) for p in points})} sets")

    def report(name, key, among=points):
        predicted = np.array([key(p) for p in among])
        measured = np.array([p["measured"] for p in among])
        right, wrong, ties = ranking(among, key)
        print(f"{name:28s} GMAE {100 * gmae(predicted, measured):5.1f}% (ratio error "
              f"{100 * ratio_error(predicted, measured):4.1f}%)   right {right}, wrong {wrong}, ties {ties}")

    report("predicted", lambda p: p["predicted"])
    if args.turns:
        for _, run in runs:
            report(f"  {run}", lambda p: p["predicted"], [p for p in points if p["run"] == run])
            for ranks in sorted({p["ranks"] for p in points if p["run"] == run}):
                report(f"    {ranks} processes", lambda p: p["predicted"],
                       [p for p in points if p["run"] == run and p["ranks"] == ranks])
        sets = defaultdict(list)
        for p in points:
            sets[(p["run"], p["seed"])].append(p)
        for (run, seed), plans in sets.items():  # each set: which plan won, by how much, and the pick
            order = sorted(plans, key=lambda p: p["measured"])
            noise = float(np.median([abs(np.log(p["run1"] / p["run2"])) for p in plans]))
            verdict = ranking(plans, lambda p: p["predicted"])
            word = "right" if verdict[0] else "wrong" if verdict[1] else "tie"
            pick = min(plans, key=lambda p: p["predicted"])
            print(f"  {run} seed {seed} ({plans[0]['ranks']} processes): measured fastest {order[0]['plan']} "
                  f"{order[0]['measured']:.1f} ms, next {order[1]['plan']} +{100 * (order[1]['measured'] / order[0]['measured'] - 1):.1f}% "
                  f"(A/A noise {100 * noise:.1f}%); predicted fastest {pick['plan']}: {word}")
        for ranks in sorted({p["ranks"] for p in points}):  # what the pick costs: its step over the fastest's
            regret, spread = [], []
            for plans in sets.values():
                if plans[0]["ranks"] == ranks:
                    fastest = min(p["measured"] for p in plans)
                    regret.append(min(plans, key=lambda p: p["predicted"])["measured"] / fastest - 1)
                    spread.append(max(p["measured"] for p in plans) / fastest - 1)
            regret = np.array(regret)
            print(f"{ranks} processes, {len(regret)} sets: the plan predicted fastest measured {100 * regret.mean():.2f}% "
                  f"over the fastest on average (median {100 * np.median(regret):.2f}%, at most {100 * regret.max():.1f}%), "
                  f"within 1% in {(regret <= 0.01).sum()}; the sets' plans spread {100 * np.mean(spread):.1f}% on average")
        against = [plans for plans in sets.values() if any(p["plan"] == "measured-greedy" for p in plans)]
        if against:  # the sets with measured-greedy's plan: the pick and NeuroShard's plan trained against it
            for ranks in sorted({plans[0]["ranks"] for plans in against}):
                among = [plans for plans in against if plans[0]["ranks"] == ranks]
                greedy = [next(p for p in plans if p["plan"] == "measured-greedy")["measured"] for plans in among]
                pick = [min(plans, key=lambda p: p["predicted"])["measured"] for plans in among]
                ours = [next(p for p in plans if p["plan"] == "neuroshard")["measured"] for plans in among]
                fastest = [min(p["measured"] for p in plans) for plans in among]
                print(f"{ranks} processes, {len(among)} sets with measured-greedy's plan: measured over measured-greedy's "
                      f"(geometric mean): the plan predicted fastest {geometric_mean(np.divide(pick, greedy)):.3f}x, "
                      f"NeuroShard's {geometric_mean(np.divide(ours, greedy)):.3f}x, the fastest "
                      f"{geometric_mean(np.divide(fastest, greedy)):.3f}x; measured-greedy's plan fastest in "
                      f"{sum(g == f for g, f in zip(greedy, fastest))}")
        oversubscribed = [p for p in points if p["ranks"] > args.cores]
        if oversubscribed:
            report(f"more ranks than {args.cores} cores", lambda p: p["predicted"], oversubscribed)
            for k in (0.8, 1.0, 1.2, 1.4):
                report(f"  work-conserving bound k={k}", lambda p, k=k: max(p["predicted"], k * p["own"] / args.cores),
                       oversubscribed)
        return
    for k in (0.8, 1.0, 1.2, 1.4):
        report(f"work-conserving bound k={k}",
               lambda p, k=k: max(p["predicted"], k * p["own"] / args.cores) if p["ranks"] > args.cores else p["predicted"])


if __name__ == "__main__":
    main()
