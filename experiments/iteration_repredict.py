"""Predict a finished iteration benchmark run again with other operator-cost files, against the same measurements.

    python experiments/iteration_repredict.py SUITE RESULTS/configs.jsonl OPS.json [OPS.json ...]
    python experiments/iteration_repredict.py --terms SUITE RESULTS/configs.jsonl OPS.json

The plans of each configuration are made again (deterministic: `iteration_benchmark.stored_plans`),
each is predicted with every operator-cost file, and the GMAE against the run's measured
iterations is printed: two overhead fits compared without timing anything again. With
``--terms``, also each term's mean predicted and measured ms over the plans (rank means, as
`iteration_benchmark` reports them) and its GMAE.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans, term_error  # noqa: E402
from neuroshard.constants import ITERATION_TERMS  # noqa: E402
from neuroshard.costmodels import resolve_cost_models  # noqa: E402
from neuroshard.costmodels.dense import load_operator_models  # noqa: E402
from neuroshard.costmodels.metrics import gmae, ratio_error  # noqa: E402
from neuroshard.search.iteration import estimate_iteration  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", help="the suite the run was made with (iteration_benchmark --suite)")
    parser.add_argument("results", help="the run's configs.jsonl")
    parser.add_argument("operator_costs", nargs="+", help="operator-cost files to predict with")
    parser.add_argument("--terms", action="store_true", help="also each term's mean predicted and measured ms")
    args = parser.parse_args()
    suite, results, ops_paths, with_terms = args.suite, args.results, args.operator_costs, args.terms
    models = resolve_cost_models(None)
    for path in ops_paths:
        ops = load_operator_models(path)
        pred, meas, runs = [], [], []
        terms_pred, terms_meas = {t: [] for t in ITERATION_TERMS}, {t: [] for t in ITERATION_TERMS}
        for config, tables, plan, row in stored_plans(suite, results, models):
            estimate = estimate_iteration(plan, tables, models, ops, config[3], config[4])
            pred.append(estimate.iteration_ms)
            meas.append(row["measured_ms"])
            runs.append((row["run1_ms"], row["run2_ms"]))
            for t in ITERATION_TERMS:
                terms_pred[t].append(float(np.mean([r.get(t, 0.0) for r in estimate.per_rank])))
                terms_meas[t].append(float(row["terms_measured"].get(t, 0.0)))
        pred, meas = np.array(pred), np.array(meas)
        print(path, f"GMAE {100*gmae(pred, meas):.1f}% (ratio error {100*ratio_error(pred, meas):.1f}%)  "
                    f"mean pred/meas {np.mean(pred/meas):.3f}  ({len(pred)} plans; A/A {100*gmae(*np.array(runs).T):.1f}% "
                    f"({100*ratio_error(*np.array(runs).T):.1f}%): the two runs against each other)")
        if with_terms:
            for t in ITERATION_TERMS:
                p, m = np.array(terms_pred[t]), np.array(terms_meas[t])
                if m.sum() > 0:
                    e = term_error(p, m)
                    print(f"  {t:20s} predicted {e['predicted_ms']:8.3f}  measured {e['measured_ms']:8.3f}  "
                          f"GMAE {100 * e['gmae']:6.1f}%  ratio error {100 * e['ratio_error']:6.1f}%")


if __name__ == "__main__":
    main()
