"""Where the iteration model puts the period's stretch, judged term by term on the runs in turns
(issue 31; no timing).

    python experiments/iteration_stretch_terms.py --suites turns two-process           # chosen on these
    python experiments/iteration_stretch_terms.py --suites embedding-heavy turns-two   # checked on these

The predicted period is the critical path stretched as `collect overheads` measured
(``OperatorModels.with_period``); the stretch must go to some terms for a rank's terms to add up to
the period. Three ways, each rank's terms against the measured ones (rank means, as
``iteration_benchmark`` reports them; per-term GMAE): all of it to the dense all-reduce (until
session 40), spread over every term in proportion, or spread over ``search.iteration.STRETCH_TERMS``
(the dense part and the collectives) in proportion. The iteration's own figure is the same for all.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans, term_error
from iteration_stored_ranking import RESULTS, TURN_OPERATORS, TURN_RUNS

from neuroshard.constants import ITERATION_TERMS
from neuroshard.costmodels import resolve_cost_models
from neuroshard.costmodels.dense import load_operator_models
from neuroshard.search.iteration import STRETCH_TERMS, critical_path, operator_durations, spread_stretch

VARIANTS = {"the dense all-reduce": ("dense_allreduce_ms",), "every term": tuple(ITERATION_TERMS),
            "STRETCH_TERMS": STRETCH_TERMS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", nargs="+", default=[s for s, _ in TURN_RUNS], help="runs in turns to judge on")
    args = ap.parse_args()
    models, ops = resolve_cost_models(None), load_operator_models(TURN_OPERATORS)
    predicted = {v: {t: [] for t in ITERATION_TERMS} for v in VARIANTS}
    measured = {t: [] for t in ITERATION_TERMS}
    for suite, run in TURN_RUNS:
        if suite not in args.suites:
            continue
        for config, tables, plan, row in stored_plans(suite, RESULTS / run / "configs.jsonl", models):
            durations, _ = operator_durations(plan, tables, models, ops, config[3], config[4])
            durations, _ = ops.with_overheads(durations)
            terms, _, path_ms = critical_path(durations)
            stretch = ops.with_period(path_ms, plan.num_devices) - path_ms
            for name, chosen in VARIANTS.items():
                rows = [dict(r) for r in terms]
                for r in rows:
                    spread_stretch(r, stretch, chosen if plan.num_devices > 1 else ("sync_ms",))
                for t in ITERATION_TERMS:
                    predicted[name][t].append(float(np.mean([r.get(t, 0.0) for r in rows])))
            for t in ITERATION_TERMS:
                measured[t].append(float(row["terms_measured"].get(t, 0.0)))
    print(f"runs: {', '.join(args.suites)}; per-term GMAE, the stretch put on")
    print(f"{'term':20s}" + "".join(f"{v:>24s}" for v in VARIANTS))
    for t in ITERATION_TERMS:
        m = np.array(measured[t])
        if m.sum() > 0:
            print(f"{t:20s}" + "".join(f"{100 * term_error(np.array(predicted[v][t]), m)['gmae']:23.1f}%" for v in VARIANTS))


if __name__ == "__main__":
    main()
