"""Predicted against measured training iterations of the included runtime: the iteration model's accuracy.

For each configuration (tables, dense model, global batch, processes), the candidate plans
of one configuration (NeuroShard's search and the greedy baselines, as `search --objective
iteration` compares them) are

* predicted by the iteration-time model (`neuroshard estimate`: `search.iteration`), and
* measured by the included runtime in one run, the plans taking turns of 3 steps (`evaluate`'s
  `iteration_ms` and breakdown; docs/decisions.md#turns-of-three-steps), twice: the second run is
  the A/A control.

It prints and writes (`--out`): per configuration and plan the predicted and measured
iteration (the mean of the two runs), the A/A ratio, the GMAE of prediction against
measurement over all (configuration, plan) pairs, the per-term errors, and the ranking
result (is the plan predicted fastest the one measured fastest? a set is decided when its
fastest plan was fastest in both runs by at least the set's A/A noise, ``common.decide``; the
rest are ties, reported apart), and whether the
iteration objective picks another plan than the embedding objective, and which one trains
faster.

    python experiments/iteration_benchmark.py --suite turns --with-random --iterations 12   # -> results/iteration_model/turns
    python experiments/iteration_benchmark.py --suite with-measured --measured-greedy --iterations 12
    python experiments/iteration_benchmark.py --suite with-measured --iterations 48 \
        --plans-from experiments/results/iteration_model/with-measured/configs.jsonl \
        --out out/with-measured-long                                    # the same plans, 4x the steps
    python experiments/iteration_benchmark.py --suite two-process --alone-vs-together 0 --plans neuroshard dim size

The last runs one configuration's plans each alone and then together (twice each) and prints each
plan's step: whether a run of several plans measures each plan's own step (taking turns, it does;
with their steps alternating one by one, a lopsided plan's waiting landed in the next plan's step).
Its output is ``results/iteration_model/alone_vs_together.txt``.

Every plan is stored with its set (``plan_file``), so a set can be predicted again or measured
again (``--plans-from``) with exactly its plans.

The operator models are fitted on random layer shapes, collectives and data loads
(`collect dense`), never on these configurations' plans.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
from common import RESULTS, decide, write_source

from neuroshard.constants import ITERATION_TERMS
from neuroshard.costmodels import resolve_cost_models
from neuroshard.costmodels.dense import load_operator_models
from neuroshard.costmodels.metrics import gmae, ratio_error
from neuroshard.datasets.families import generate
from neuroshard.measured.api import measured_search
from neuroshard.model_spec import DEFAULT_MODEL, ModelSpec
from neuroshard.plan import Plan
from neuroshard.runtime.evaluate import evaluate, evaluate_together
from neuroshard.search.api import search_plan
from neuroshard.search.iteration import estimate_iteration
from neuroshard.search.registry import with_trait

log = logging.getLogger("iteration_benchmark")

MEDIUM = ModelSpec(13, (256, 64), (256, 128), "dot", "medium-dot")
LARGE = ModelSpec(13, (512, 256), (1024, 512, 256), "dot", "large-dot")
CAT = ModelSpec(32, (128,), (512, 128), "cat", "medium-cat")
#: (family, tables, seed, model, global batch, processes)
CONFIGS = [
    ("dlrm-2021", 8, 11, DEFAULT_MODEL, 512, 2),
    ("dlrm-2021", 12, 12, MEDIUM, 1024, 2),
    ("criteo-kaggle", 26, 13, LARGE, 2048, 2),
    ("hot-few", 10, 14, CAT, 1024, 2),
    ("dlrm-2021", 16, 15, LARGE, 512, 2),
    ("dlrm-2022", 10, 16, CAT, 2048, 2),
    ("dlrm-2021", 9, 21, MEDIUM, 768, 3),
    ("criteo-kaggle", 26, 22, DEFAULT_MODEL, 1536, 3),
    ("hot-few", 12, 23, LARGE, 1536, 3),
    ("dlrm-2022", 12, 24, CAT, 768, 3),
]
#: where the embeddings take most of a step (the small default dense model, many or hot tables,
#: large batches), so the candidate plans differ by more than the run's noise: the ranking test,
#: on seeds none of the models saw
EMBEDDING_HEAVY = [
    ("hot-few", 16, 31, DEFAULT_MODEL, 4096, 2),
    ("hot-few", 24, 32, DEFAULT_MODEL, 2048, 2),
    ("dlrm-2021", 20, 33, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2022", 24, 34, DEFAULT_MODEL, 2048, 2),
    ("broad", 20, 35, DEFAULT_MODEL, 4096, 2),
    ("hot-few", 18, 36, DEFAULT_MODEL, 3072, 3),
    ("dlrm-2021", 24, 37, DEFAULT_MODEL, 3072, 3),
    ("dlrm-2022", 18, 38, DEFAULT_MODEL, 4096, 3),
]
#: a third suite on fresh seeds (51-58), for an overhead refit with 4 embedding-heavy calibration
#: configurations (seeds 113-116; not shipped: it did worse here): both regimes,
#: all four dense models, 2 and 3 processes
FRESH = [
    ("criteo-kaggle", 26, 51, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2022", 20, 52, MEDIUM, 2048, 2),
    ("hot-few", 20, 53, DEFAULT_MODEL, 3072, 2),
    ("broad", 16, 54, CAT, 1024, 2),
    ("dlrm-2021", 14, 55, LARGE, 1536, 3),
    ("broad", 22, 56, DEFAULT_MODEL, 4096, 3),
    ("hot-few", 14, 57, MEDIUM, 2048, 3),
    ("dlrm-2022", 22, 58, DEFAULT_MODEL, 2560, 3),
]
#: the ranking test again at two processes, one per core as the VM reports it (seeds 61-66; 3 ranks
#: take turns on 2 cores), the small default dense model, big batches
TWO_PROCESS = [
    ("hot-few", 20, 61, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2021", 24, 62, DEFAULT_MODEL, 4096, 2),
    ("broad", 24, 63, DEFAULT_MODEL, 3072, 2),
    ("dlrm-2022", 20, 64, DEFAULT_MODEL, 4096, 2),
    ("criteo-kaggle", 26, 65, DEFAULT_MODEL, 4096, 2),
    ("hot-few", 28, 66, DEFAULT_MODEL, 2048, 2),
]
#: the ranking test on fresh seeds (71-80) once plans measured together take turns
#: (docs/decisions.md#turns-of-three-steps); 2 and 3 processes, four dense models
TURNS = [
    ("hot-few", 20, 71, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2021", 24, 72, DEFAULT_MODEL, 4096, 2),
    ("broad", 24, 73, MEDIUM, 3072, 2),
    ("dlrm-2022", 20, 74, DEFAULT_MODEL, 4096, 2),
    ("criteo-terabyte", 16, 75, DEFAULT_MODEL, 4096, 2),
    ("criteo-kaggle", 26, 80, LARGE, 2048, 2),
    ("hot-few", 18, 76, DEFAULT_MODEL, 3072, 3),
    ("dlrm-2021", 24, 77, CAT, 3072, 3),
    ("dlrm-2022", 18, 78, DEFAULT_MODEL, 4096, 3),
    ("broad", 22, 79, DEFAULT_MODEL, 4096, 3),
]
#: more ranking sets at 2 processes, one per core (seeds 81-90)
TURNS_TWO = [
    ("hot-few", 22, 81, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2021", 20, 82, DEFAULT_MODEL, 4096, 2),
    ("broad", 20, 83, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2022", 24, 84, DEFAULT_MODEL, 3072, 2),
    ("criteo-terabyte", 20, 85, DEFAULT_MODEL, 4096, 2),
    ("hot-few", 16, 86, MEDIUM, 4096, 2),
    ("dlrm-2021", 28, 87, DEFAULT_MODEL, 2048, 2),
    ("criteo-kaggle", 26, 88, DEFAULT_MODEL, 4096, 2),
    ("broad", 28, 89, CAT, 3072, 2),
    ("criteo-terabyte", 14, 90, MEDIUM, 4096, 2),  # 24 tables: every rank holds all six plans' shards, 15.6 GB
]
#: the sets a user chooses among: NeuroShard's plan, the greedy baselines' and measured-greedy's
#: (timed on this machine at the configuration's global batch; random's plan left out: six candidates),
#: fresh seeds 91-104 at 2 processes, one per core. Every plan is stored in the run's
#: configs.jsonl (measured-greedy's depends on timing, so it cannot be made again)
WITH_MEASURED = [
    ("hot-few", 20, 91, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2021", 22, 92, DEFAULT_MODEL, 4096, 2),
    ("broad", 22, 93, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2022", 20, 94, DEFAULT_MODEL, 4096, 2),
    ("criteo-terabyte", 12, 95, DEFAULT_MODEL, 4096, 2),
    ("hot-few", 24, 96, MEDIUM, 3072, 2),
    ("dlrm-2021", 18, 97, CAT, 4096, 2),
    ("criteo-kaggle", 26, 98, DEFAULT_MODEL, 3072, 2),
    ("broad", 26, 99, DEFAULT_MODEL, 3072, 2),
    ("dlrm-2022", 16, 100, MEDIUM, 4096, 2),
    ("hot-few", 16, 101, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2021", 26, 102, DEFAULT_MODEL, 3072, 2),
    ("broad", 18, 103, CAT, 4096, 2),
    ("dlrm-2022", 26, 104, DEFAULT_MODEL, 3072, 2),
]
#: more such sets (seeds 105-118), ten at 2 processes and four at 3 processes on 2 cores
WITH_MEASURED_TWO = [
    ("hot-few", 22, 105, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2021", 24, 106, DEFAULT_MODEL, 4096, 2),
    ("broad", 20, 107, DEFAULT_MODEL, 4096, 2),
    ("dlrm-2022", 22, 108, DEFAULT_MODEL, 4096, 2),
    ("criteo-terabyte", 14, 109, DEFAULT_MODEL, 3072, 2),
    ("dlrm-2021", 16, 110, MEDIUM, 4096, 2),
    ("broad", 24, 111, DEFAULT_MODEL, 3072, 2),
    ("dlrm-2022", 18, 112, CAT, 4096, 2),
    ("criteo-kaggle", 26, 113, DEFAULT_MODEL, 4096, 2),
    ("hot-few", 26, 114, DEFAULT_MODEL, 3072, 2),
    ("dlrm-2021", 20, 115, DEFAULT_MODEL, 4096, 3),
    ("broad", 20, 116, DEFAULT_MODEL, 4096, 3),
    ("dlrm-2022", 18, 117, DEFAULT_MODEL, 3072, 3),
    ("hot-few", 18, 118, DEFAULT_MODEL, 4096, 3),
]
SUITES = {"default": CONFIGS, "embedding-heavy": EMBEDDING_HEAVY, "fresh": FRESH, "two-process": TWO_PROCESS,
          "turns": TURNS, "turns-two": TURNS_TWO, "with-measured": WITH_MEASURED,
          "with-measured-two": WITH_MEASURED_TWO}


def plans_of(tables, devices: int, models, with_random: bool = False, measured_greedy: bool = False) -> dict:
    """NeuroShard's plan and the greedy baselines' (random only ``with_random``), 64 GiB per device;
    with ``measured_greedy`` measured-greedy's too, its units timed here at ``tables.batch_size``."""
    out = {"neuroshard": search_plan(tables, devices, "64GiB", "neuroshard", cost_models=models)}
    for name in with_trait("greedy_baseline"):
        if name != "random" or with_random:
            out[name] = search_plan(tables, devices, "64GiB", name, cost_models=models)
    if measured_greedy:
        out["measured-greedy"] = measured_search(tables, devices, "64GiB", "measured-greedy", cost_models=models,
                                                 batch_size=tables.batch_size)
    unique, seen = {}, set()
    for name, plan in out.items():  # the same plan twice would be one candidate measured twice
        key = tuple(sorted((s.table, s.row_offset, s.num_rows, s.col_offset, s.num_cols, s.device) for s in plan.shards))
        if key not in seen:
            seen.add(key)
            unique[name] = plan
    return unique


def config_tables(config):
    """A configuration's tables, at its global batch."""
    family, count, seed, _, batch, _ = config
    tables = generate(family, num_tables=count, seed=seed)
    tables.batch_size = batch
    return tables


def config_plans(config, models, with_random: bool = False, measured_greedy: bool = False) -> tuple:
    """A configuration's tables (at its global batch) and candidate plans (``plans_of``)."""
    tables = config_tables(config)
    return tables, plans_of(tables, config[5], models, with_random, measured_greedy)


def stored_plans(suite: str, results: str | Path, models):
    """The plans of a finished run of ``suite``: per plan of its ``configs.jsonl``, ``(config,
    tables, plan, row)``, ``row`` the stored result of that plan (its measured iteration and
    terms). Plans stored in the row (``plan_file``) are read back; runs without them have theirs
    made again (deterministic: ``config_plans``)."""
    by_seed = {c[2]: c for c in SUITES[suite]}
    for line in Path(results).read_text().splitlines():
        if not line.strip():
            continue
        result = json.loads(line)
        config = by_seed[result["seed"]]
        if all("plan_file" in row for row in result["plans"]):
            tables = config_tables(config)
            for row in result["plans"]:
                yield config, tables, Plan.from_dict(row["plan_file"], f"{results}: seed {result['seed']}"), row
            continue
        tables, plans = config_plans(config, models, with_random=any(p["plan"] == "random" for p in result["plans"]))
        for row in result["plans"]:
            yield config, tables, plans[row["plan"]], row


def run_config(config, models, ops, iterations: int, warmup: int, with_random: bool = False,
               measured_greedy: bool = False, stored: dict | None = None) -> dict:
    """Predict and measure one configuration's set (twice: the A/A control); ``stored``: its plans
    by name, taken instead of searched (``--plans-from``: the same set measured again)."""
    family, count, seed, model, batch, devices = config
    if stored is not None:
        tables, plans = config_tables(config), stored
    else:
        tables, plans = config_plans(config, models, with_random, measured_greedy)
    names = list(plans)
    predicted = {n: estimate_iteration(p, tables, models, ops, model, batch) for n, p in plans.items()}
    runs = []
    for order in (names, names[::-1]):  # the A/A control: the same plans again, in the other order
        measured = evaluate_together([plans[n] for n in order], tables, devices, iterations=iterations,
                                     warmup=warmup, batch_size=batch, model=model)
        runs.append({n: m for n, m in zip(order, measured)})
    rows = []
    for n in names:
        a, b = runs[0][n], runs[1][n]
        mean = 0.5 * (a.iteration_ms + b.iteration_ms)
        terms_pred = {t: float(np.mean([row.get(t, 0.0) for row in predicted[n].per_rank])) for t in ITERATION_TERMS}
        terms_meas = {t: float(np.mean([0.5 * (ra.get(t, 0.0) + rb.get(t, 0.0))
                                        for ra, rb in zip(a.breakdown, b.breakdown)])) for t in ITERATION_TERMS}
        # per rank too: which rank a plan loads is what the rank means hide
        per_rank_pred = [{t: round(float(row.get(t, 0.0)), 4) for t in ITERATION_TERMS} for row in predicted[n].per_rank]
        per_rank_meas = [{t: round(float(0.5 * (ra.get(t, 0.0) + rb.get(t, 0.0))), 4) for t in ITERATION_TERMS}
                         for ra, rb in zip(a.breakdown, b.breakdown)]
        rows.append({"plan": n, "predicted_ms": predicted[n].iteration_ms, "measured_ms": mean,
                     "run1_ms": a.iteration_ms, "run2_ms": b.iteration_ms,
                     "terms_predicted": terms_pred, "terms_measured": terms_meas,
                     "per_rank_predicted": per_rank_pred, "per_rank_measured": per_rank_meas,
                     "plan_file": plans[n].to_dict()})
    return {"family": family, "tables": count, "seed": seed, "model": model.name, "batch": batch,
            "devices": devices, "plans": rows}


def term_error(predicted: np.ndarray, measured: np.ndarray) -> dict:
    """One term's mean predicted and measured ms over plans, its GMAE and ratio error; plans
    without the term (both 0) are left out (no exact hit of the model)."""
    held = (predicted > 1e-3) | (measured > 1e-3)
    p, m = np.maximum(predicted[held], 1e-3), np.maximum(measured[held], 1e-3)
    return {"predicted_ms": float(p.mean()), "measured_ms": float(m.mean()), "gmae": gmae(p, m),
            "ratio_error": ratio_error(p, m)}


def summarize(results: list[dict]) -> dict:
    pred = np.array([r["predicted_ms"] for c in results for r in c["plans"]])
    meas = np.array([r["measured_ms"] for c in results for r in c["plans"]])
    run1 = np.array([r["run1_ms"] for c in results for r in c["plans"]])
    run2 = np.array([r["run2_ms"] for c in results for r in c["plans"]])
    aa = gmae(run1, run2)
    terms = {}
    for t in ITERATION_TERMS:
        p = np.array([r["terms_predicted"][t] for c in results for r in c["plans"]])
        m = np.array([r["terms_measured"][t] for c in results for r in c["plans"]])
        if m.sum() > 0:
            terms[t] = {k: round(v, 3) for k, v in term_error(p, m).items()}
    right = ties = wrong = 0
    objective = []
    for c in results:
        if len(c["plans"]) < 2:
            ties += 1
        else:
            decided, first = decide(np.log([[r["run1_ms"] for r in c["plans"]]]),
                                    np.log([[r["run2_ms"] for r in c["plans"]]]))
            pick = int(np.argmin([r["predicted_ms"] for r in c["plans"]]))
            if not decided[0]:
                ties += 1
            elif pick == first[0]:
                right += 1
            else:
                wrong += 1
        emb = next(r for r in c["plans"] if r["plan"] == "neuroshard")
        pick = min((r for r in c["plans"] if r["plan"] != "random"), key=lambda r: r["predicted_ms"])  # as search does
        objective.append({"config": f"{c['family']} x{c['tables']} {c['model']} b{c['batch']} p{c['devices']}",
                          "embedding_pick": "neuroshard", "iteration_pick": pick["plan"],
                          "measured_ratio_iteration_to_embedding": round(pick["measured_ms"] / emb["measured_ms"], 4)})
    # GMAE as Lin et al. and costmodels.metrics define it; ratio_error: exp(mean |log(predicted / measured)|) - 1
    return {"points": len(pred), "gmae": round(gmae(pred, meas), 4), "aa_gmae": round(aa, 4),
            "ratio_error": round(ratio_error(pred, meas), 4), "aa_ratio_error": round(ratio_error(run1, run2), 4),
            "per_configuration_gmae": [round(gmae(np.array([r["predicted_ms"] for r in c["plans"]]),
                                                  np.array([r["measured_ms"] for r in c["plans"]])), 4) for c in results],
            "terms": terms, "ranking": {"right": right, "wrong": wrong, "ties": ties,
                                        "right_share_of_decided": round(right / max(1, right + wrong), 3)},
            "objective": objective}


def alone_vs_together(config, names: list[str] | None, iterations: int, warmup: int) -> None:
    """One configuration's plans measured each alone (``evaluate``), then all together
    (``evaluate_together``: the plans taking turns), twice; prints each plan's ``iteration_ms``."""
    tables, plans = config_plans(config, resolve_cost_models(None), with_random=True)
    names = names or list(plans)
    model, batch, devices = config[3], config[4], config[5]
    for rep in range(2):
        for name in names:
            m = evaluate(plans[name], tables, devices, iterations=iterations, warmup=warmup, batch_size=batch,
                         model=model)
            print(f"run {rep + 1} alone    {name:12s} {m.iteration_ms:7.1f} ms", flush=True)
        together = evaluate_together([plans[n] for n in names], tables, devices, iterations=iterations, warmup=warmup,
                                     batch_size=batch, model=model)
        print(f"run {rep + 1} together " + "  ".join(f"{n} {m.iteration_ms:.1f} ms" for n, m in zip(names, together)),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="results folder (default: experiments/results/iteration_model/SUITE)")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--suite", choices=sorted(SUITES), default="default",
                    help="default: mixed dense and embedding work; embedding-heavy: the ranking test; "
                         "fresh: both regimes on fresh seeds; two-process: the ranking test at 2 processes; "
                         "turns: the ranking test on fresh seeds at 2 and 3 processes; "
                         "turns-two: more of it at 2 processes; with-measured: sets with measured-greedy's "
                         "plan (with --measured-greedy); with-measured-two: more of them, at 2 and 3 processes")
    ap.add_argument("--configs", type=int, nargs="*", default=None, help="indices of the suite to run (default: all)")
    ap.add_argument("--measured-greedy", action="store_true",
                    help="add measured-greedy's plan to each set (timed here first; the with-measured suite's sets)")
    ap.add_argument("--plans-from", type=Path, default=None,
                    help="a finished run's configs.jsonl: measure its stored plans again (e.g. with more --iterations)")
    ap.add_argument("--operator-costs", default=None, help="operator cost models (default: the shipped ones)")
    ap.add_argument("--with-random", action="store_true",
                    help="add the random baseline's plan to each set (plans that differ more: rankings decidable)")
    ap.add_argument("--alone-vs-together", type=int, default=None, metavar="INDEX",
                    help="configuration INDEX of --suite: its plans (--plans) measured each alone, then together, "
                         "twice; prints each plan's step (nothing written)")
    ap.add_argument("--plans", nargs="*", default=None, help="with --alone-vs-together: the plans (default: all)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.alone_vs_together is not None:
        alone_vs_together(SUITES[args.suite][args.alone_vs_together], args.plans, args.iterations, args.warmup)
        return
    if args.out is None:
        args.out = RESULTS / "iteration_model" / args.suite
    args.out.mkdir(parents=True, exist_ok=True)
    write_source(args.out)
    models, ops = resolve_cost_models(None), load_operator_models(args.operator_costs)
    results = []
    done = args.out / "configs.jsonl"
    if done.exists():  # resumable: finished configurations are kept
        results = [json.loads(line) for line in done.read_text().splitlines() if line.strip()]
    suite = SUITES[args.suite]
    chosen = [suite[i] for i in (args.configs if args.configs is not None else range(len(suite)))]
    stored = {}
    if args.plans_from is not None:  # by seed: the plans stored with each set
        for config, _, plan, row in stored_plans(args.suite, args.plans_from, models):
            stored.setdefault(config[2], {})[row["plan"]] = plan
    for config in chosen:
        key = (config[0], config[1], config[2], config[3].name, config[4], config[5])
        if any((r["family"], r["tables"], r["seed"], r["model"], r["batch"], r["devices"]) == key for r in results):
            continue
        if args.plans_from is not None and config[2] not in stored:
            continue
        start = time.perf_counter()
        result = run_config(config, models, ops, args.iterations, args.warmup, args.with_random, args.measured_greedy,
                            stored.get(config[2]))
        results.append(result)
        with done.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"{key}: " + ", ".join(f"{r['plan']} {r['predicted_ms']:.1f}/{r['measured_ms']:.1f}" for r in result["plans"])
              + f" ms predicted/measured ({time.perf_counter() - start:.0f} s)", flush=True)
    summary = summarize(results)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n{summary['points']} plans: predicted vs measured iteration GMAE {100 * summary['gmae']:.1f}% "
          f"(A/A {100 * summary['aa_gmae']:.1f}%); ratio error {100 * summary['ratio_error']:.1f}% "
          f"(A/A {100 * summary['aa_ratio_error']:.1f}%)")
    for t, e in summary["terms"].items():
        print(f"  {t:20s} predicted {e['predicted_ms']:8.3f}  measured {e['measured_ms']:8.3f}  GMAE {100 * e['gmae']:6.1f}%"
              f"  ratio error {100 * e['ratio_error']:6.1f}%")
    print(f"ranking: {summary['ranking']}")
    for o in summary["objective"]:
        print(f"  {o}")


if __name__ == "__main__":
    main()
