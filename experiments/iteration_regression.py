"""How far can a refit of the overheads take the iteration model? (issue 31)

    python experiments/iteration_regression.py
    python experiments/iteration_regression.py --results experiments/results/iteration_sameday \
        --operator-costs experiments/results/iteration_sameday/cpu-operators.json

Reads the three finished iteration suites (by default ``experiments/results/iteration``,
``iteration_ranking``, ``iteration_fresh``, run on three days; with ``--results DIR``, the
suites ``DIR/default``, ``DIR/embedding-heavy`` and ``DIR/fresh`` of one run: their measured
iterations and terms), predicts every plan's operator durations again with the operator
models (``--operator-costs``, default the shipped ones) (``search.iteration.operator_durations``: no overheads,
no critical path) and fits the most flexible correction of the current kind that the data
allows: per rank count, the measured iteration as a non-negative sum of ``fixed + scale x
duration`` over the terms (NNLS, relative error), fitted on two suites and judged on the third.
Optionally (``regime``) each term's scale also grows with the plan's embedding share of the
compute (embedding-heavy steps crowd the caches of the dense work). It prints, per held-out
suite, the GMAE of the shipped model, of the refit, and the noise floor of the measurement (the
GMAE of one run against the mean of both runs). An overhead refit cannot do better than such a
fit on its own suites, so what it leaves on the held-out suite is what a structural change must
remove.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans  # noqa: E402

from neuroshard.constants import ITERATION_TERMS  # noqa: E402
from neuroshard.costmodels import resolve_cost_models  # noqa: E402
from neuroshard.costmodels.dense import load_operator_models  # noqa: E402
from neuroshard.costmodels.metrics import gmae  # noqa: E402
from neuroshard.search.iteration import estimate_iteration, operator_durations  # noqa: E402

RESULTS = {"default": "experiments/results/iteration/configs.jsonl",
           "embedding-heavy": "experiments/results/iteration_ranking/configs.jsonl",
           "fresh": "experiments/results/iteration_fresh/configs.jsonl"}
#: the terms a refit scales (the barrier and the bookkeeping have no operator duration)
SCALED = [t for t in ITERATION_TERMS if t not in ("sync_ms", "other_ms", "allreduce_ms")]


def rows(results: dict[str, str], operator_costs: str | None) -> list[dict]:
    """Per (suite, configuration, plan): ranks, the rank-mean operator durations, the
    prediction of the operator file as it is, the measured iteration and both runs."""
    models, ops = resolve_cost_models(None), load_operator_models(operator_costs)
    out = []
    for suite, path in results.items():
        for config, tables, plan, p in stored_plans(suite, path, models):
            durations, _ = operator_durations(plan, tables, models, ops, config[3], config[4])
            mean = {t: float(np.mean([d.get(t, 0.0) for d in durations])) for t in SCALED}
            emb = mean["emb_fwd_ms"] + mean["emb_bwd_ms"]
            out.append({"suite": suite, "ranks": config[5], "durations": mean,
                        "share": emb / max(emb + mean["dense_fwd_ms"] + mean["dense_bwd_ms"], 1e-9),
                        "shipped": estimate_iteration(plan, tables, models, ops, config[3], config[4]).iteration_ms,
                        "measured": p["measured_ms"], "runs": (p["run1_ms"], p["run2_ms"])})
    return out


def design(points: list[dict], regime: bool) -> np.ndarray:
    columns = [np.ones(len(points))]
    for t in SCALED:
        d = np.array([p["durations"][t] for p in points])
        columns.append(d)
        if regime:
            columns.append(d * np.array([p["share"] for p in points]))
    return np.column_stack(columns)


def refit(train: list[dict], test: list[dict], regime: bool) -> np.ndarray:
    predicted = np.zeros(len(test))
    for ranks in sorted({p["ranks"] for p in test}):
        fit = [p for p in train if p["ranks"] == ranks]
        where = [i for i, p in enumerate(test) if p["ranks"] == ranks]
        measured = np.array([p["measured"] for p in fit])
        weight = 1.0 / measured
        coef, _ = nnls(design(fit, regime) * weight[:, None], measured * weight)
        predicted[where] = design([test[i] for i in where], regime) @ coef
    return predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", help="a folder with the suites default, embedding-heavy and fresh of one run")
    parser.add_argument("--operator-costs", help="operator cost models (default: the shipped ones)")
    args = parser.parse_args()
    results = ({suite: str(Path(args.results) / suite / "configs.jsonl") for suite in RESULTS} if args.results
               else RESULTS)
    points = rows(results, args.operator_costs)
    print(f"# python experiments/iteration_regression.py {' '.join(sys.argv[1:])}  (fitted on two suites, judged on the third)")
    print(f"{'held-out suite':16s} {'plans':>5s} {'as is':>8s} {'refit':>8s} {'refit+regime':>13s} {'noise floor':>12s}")
    for suite in results:
        train = [p for p in points if p["suite"] != suite]
        test = [p for p in points if p["suite"] == suite]
        measured = np.array([p["measured"] for p in test])
        one_run = np.array([p["runs"][0] for p in test])
        figures = [gmae(np.array([p["shipped"] for p in test]), measured), gmae(refit(train, test, False), measured),
                   gmae(refit(train, test, True), measured), gmae(one_run, measured)]
        print(f"{suite:16s} {len(test):5d} " + " ".join(f"{100 * f:7.1f}%" for f in figures[:2])
              + f" {100 * figures[2]:12.1f}% {100 * figures[3]:11.1f}%")


if __name__ == "__main__":
    main()
