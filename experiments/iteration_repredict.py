"""Predict a finished iteration benchmark run again with other operator-cost files, against the same measurements.

    python experiments/iteration_repredict.py SUITE RESULTS/configs.jsonl OPS.json [OPS.json ...]

The plans of each configuration are made again (deterministic: `iteration_benchmark.stored_plans`),
each is predicted with every operator-cost file, and the GMAE against the run's measured
iterations is printed: two overhead fits compared without timing anything again.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans  # noqa: E402
from neuroshard.costmodels import resolve_cost_models  # noqa: E402
from neuroshard.costmodels.dense import load_operator_models, gmae  # noqa: E402
from neuroshard.search.iteration import estimate_iteration  # noqa: E402


def main() -> None:
    suite, results, ops_paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    models = resolve_cost_models(None)
    for path in ops_paths:
        ops = load_operator_models(path)
        pred, meas = [], []
        for config, tables, plan, row in stored_plans(suite, results, models):
            pred.append(estimate_iteration(plan, tables, models, ops, config[3], config[4]).iteration_ms)
            meas.append(row["measured_ms"])
        pred, meas = np.array(pred), np.array(meas)
        print(path, f"GMAE {100*gmae(pred, meas):.1f}%  mean pred/meas {np.mean(pred/meas):.3f}")

if __name__ == "__main__":
    main()
