"""Plan benchmark: every algorithm's plans, measured device by device, across table families.

    python experiments/plan_benchmark.py                 # all families, 4/8/16 devices, 4 tasks each
    python experiments/plan_benchmark.py --quick         # 1 task per family on 4 devices, fewer tables
    python experiments/plan_benchmark.py --families criteo-terabyte broad --devices 8 --tasks 2
    python experiments/plan_benchmark.py --families criteo-terabyte criteo-kaggle dlrm-2021 --devices 4 \\
        --tasks 1 --tables-per-device 8 12 --one-host --no-torchrec --calibrate --refine-rounds 1 \\
        --row-blocks any --seed 211                    # a results-page run: plain, calibrated, refined

The results page (``report.py``, docs/results.md) counts the runs listed in
``results/plans_vs_baselines/runs.csv`` (each task as its latest run measured it); a new run
counts once its line is added there (its ``SOURCE.json`` has the date, commit and CPU).

Per family and device count, ``--tasks`` tasks (``neuroshard.datasets.families.family_tasks``:
``--tables-per-device`` tables per device, memory 1.2-1.5x the tables' total over the
devices, tables larger than a device split by the planner). Every algorithm plans each
task: NeuroShard, the five greedy, measured-greedy, TorchRec's planner (when importable)
and bayes. Then ALL plans of the task are measured in ONE interleaved run of
``neuroshard measure`` (``runtime.measure_plan.measure_plans``: each device's shards as
one fused kernel, devices of all plans taking turns, the fastest of the passes), together with
an A/A control: the measured-greedy plan (the baseline to beat) a second time. Identical
plans of two algorithms (refine keeping a baseline's plan, say) are timed once and share
the measurement.
With ``--calibrate`` each task first calibrates the cost models on its own tables
(``neuroshard.measured.calibrate``) and adds NeuroShard's plan against them as ``search
--calibrate`` writes it (``measured.api.calibrated_search``: the pre-trained models' plan
instead when it measures cheaper, the two timed together), and the plan of measured refinement from the same calibration (``neuroshard.measured.refine``,
``--refine-rounds``). ``--row-blocks any`` lets our searches (plain, calibrated, refine's) cut
tables into row blocks TorchRec does not run (``constants.ROW_BLOCKS``); the baselines plan as
always, and the plain search with TorchRec's layouts is timed in the same run as
``neuroshard-torchrec-layouts`` (what the option buys, paired). The A/A line also gives ``aa_spearman``: the Spearman of the control
plan's devices against the same devices measured again, the ceiling the noise of the run
puts on any model's within-plan Spearman.

Printed per family, per algorithm: measured max-device compute as a ratio to the best
baseline of the task (five greedy, measured-greedy, TorchRec; geometric mean and worst),
max/mean balance, the cost model's per-device error against the measurement (GMAE,
Spearman of devices within a plan), search time, and all-to-all bytes per device (the
largest device's forward pooled output at the tables' batch size, fp32). The A/A control
line shows the noise of the run. The "balance bound" line is 1 / the best baseline's
max/mean balance: the ratio a perfectly balanced plan with the same total compute would
reach, so a target below it asks for less total work, not better balance. The "work
bound" line is the least total compute any plan of the task reached, spread evenly over
the devices, over the best baseline's max device: the physical limit of the task on
this instrument. ``total_ratio_geomean`` compares a plan's total compute (the sum of its
devices) with the least of the baselines'; ``estimate_total_error`` (and
``_calibrated``) how far the cost model's total of a plan's devices is from the measured
total (per task ``estimate_total_ratio``, predicted over measured),
and ``estimate_total_error_relative`` the same with each task's level removed (every ratio
over the geometric mean of its task's plans' ratios): whether the model sees which plans
do more work, apart from how fast the machine ran that day.
Results go
to ``--out`` (default ``experiments/results/plans_vs_baselines/<date>_<devices>dev_seed<seed>``):
``SOURCE.json`` (the command, date, commit and CPU), ``tasks.csv`` (one row per task and plan,
appended as each task finishes, so an interrupted run resumes where it stopped),
``devices.csv`` (one row per task, plan and device: measured and estimated compute, shards,
rows and widths: the cost model's per-device errors on held-out tasks), ``summary.csv``, ``summary.md``, ``ratios.png`` and, with ``--refine-rounds``, each task's
refine record (``refine_<family>_<D>dev_task<N>.json``: every plan refine timed, its finalists'
two runs, polish's steps).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import RESULTS, source_record, write_source

from neuroshard.constants import DEFAULT_ROW_BLOCKS, ROW_BLOCKS, TIMING_PASSES, TIMING_REPEATS
from neuroshard.costmodels import CostModels, load_cost_models
from neuroshard.costmodels.metrics import gmae
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.errors import NeuroShardError
from neuroshard.runtime.measure_plan import estimate_gmae, estimate_spearman, measure_plans
from neuroshard.search.api import search_plan
from neuroshard.search.registry import ALGORITHMS, get_trait
from neuroshard.search.simulator import Simulator
from neuroshard.topology import Topology
from neuroshard.torchrec.guard import torchrec_available

log = logging.getLogger("plan_benchmark")

CONTROL = "control"  # the A/A control: the measured-greedy plan measured a second time
UNCORRECTED = "neuroshard-calibrated-uncorrected"  # the calibrated models without the set-size correction
CALIBRATED = "neuroshard-calibrated"  # with --calibrate: NeuroShard against models calibrated on the task
REFINED = "neuroshard-refined"  # with --calibrate: then measured refinement (measured.refine) from that calibration
REFINED_BUDGET = "neuroshard-refine-budget"  # with --refine-budget: `search --refine` as a user runs it
UNCHECKED = "neuroshard-refined-unchecked"  # with --polish-ab: refine's polished plan without polish's final check
#: with --row-blocks any: the plain search with TorchRec's layouts too, timed in the same run (a paired comparison)
TORCHREC_LAYOUTS = "neuroshard-torchrec-layouts"
#: columns of tasks.csv (every task's rows are written in this order)
COLUMNS = ["family", "devices", "task", "tables", "memory_bytes", "algorithm", "failed", "max_compute_ms",
           "ratio_to_best_baseline", "balance", "estimated_max_compute_ms", "estimate_gmae", "estimate_spearman",
           "max_total_ms", "search_time_s", "a2a_bytes_per_device", "a2a_ratio_to_best_baseline", "shards",
           "aa_ratio", "measure_seconds", "hardware", "calibration_s", "estimate_gmae_calibrated",
           "estimate_spearman_calibrated", "estimate_gmae_also", "estimate_spearman_also", "aa_spearman",
           "refine_chosen_round", "polish_accepted", "refine_chosen", "total_compute_ms",
           "total_ratio_to_least_baseline", "work_bound_ratio", "estimate_total_ratio",
           "estimate_total_ratio_calibrated", "row_split_tables", "column_split_tables"]


def algorithms(include_torchrec: bool) -> list[str]:
    """Every registered algorithm (TorchRec's planner only when asked for)."""
    return [a for a in ALGORITHMS if include_torchrec or a != "torchrec"]


def baselines(include_torchrec: bool) -> list[str]:
    """What NeuroShard is compared with: every algorithm that is not guided by our cost models
    (the registry's ``model_guided`` trait: NeuroShard itself and bayes)."""
    return [a for a in algorithms(include_torchrec) if not get_trait(a, "model_guided")]


def a2a_bytes_per_device(plan, batch_size: int) -> float:
    """Bytes the largest device sends in the forward all-to-all (fp32 pooled outputs)."""
    widths = [sum(s.num_cols for s in plan.shards_on(d)) for d in range(plan.num_devices)]
    share = (plan.num_devices - 1) / plan.num_devices
    return max(widths) * batch_size * 4 * share


def total_ratio(estimated, measured) -> float:
    """A plan's predicted total compute (the sum of its devices) over its measured total."""
    return float(np.sum(estimated) / np.sum(measured))


def total_error(ratios: pd.Series) -> float:
    """GMAE of plans' predicted totals (|predicted - measured| / measured, from their ratios),
    the metric ``estimate_gmae`` is over devices."""
    ratios = ratios.to_numpy(float)
    return gmae(ratios, np.ones_like(ratios))


def split_columns(plan, tables) -> dict:
    """How many tables the plan splits by rows and by columns (a table may be both)."""
    rows = {s.table for s in plan.shards if s.num_rows < tables[s.table].num_embeddings}
    cols = {s.table for s in plan.shards if s.num_cols < tables[s.table].embedding_dim}
    return {"row_split_tables": len(rows), "column_split_tables": len(cols)}


def refine_columns(refine: dict) -> dict:
    """What refinement kept (empty for other plans): the round (NaN for a compared baseline's
    plan), whose plan (``round N`` or the baseline) and the polish changes kept."""
    if not refine:
        return {}
    return {"refine_chosen_round": math.nan if refine.get("chosen_round") is None else refine["chosen_round"],
            "refine_chosen": refine.get("chosen", ""),
            "polish_accepted": refine.get("polish", {}).get("accepted", math.nan)}


def run_task(family: str, devices: int, index: int, tables, memory: int, args, models) -> tuple[list[dict], list[dict]]:
    """Plan the task with every algorithm, measure all plans in one interleaved run. Returns the
    task's rows (tasks.csv) and its devices' (devices.csv)."""
    plans, rows = {}, []
    # --one-host: every plan is for one host of D GPUs (analytic NVLink exchange, TorchRec's constants)
    network = {"topology": Topology(devices, local_world_size=devices)} if args.one_host else {}
    # --row-blocks any: our searches may cut tables into row blocks TorchRec does not run (the
    # baselines' are as always: the memory split's TorchRec counts; measured-greedy's its own)
    ours = {**network, "row_blocks": args.row_blocks}
    calibrated = None
    others = {}  # label -> models: every plan's estimate error is also reported under each
    if args.also_model:
        other = load_cost_models(args.also_model)
        label = f"neuroshard@{Path(args.also_model).stem}"
        plans[label] = search_plan(tables, devices=devices, memory=memory, cost_models=other, seed=index, **network)
        others["also"] = other
    if args.calibrate:
        from neuroshard.measured.api import calibrated_search
        from neuroshard.measured.calibrate import start_calibration
        from neuroshard.search.api import check_task
        from neuroshard.measured.refine import refine
        start = time.perf_counter()
        calibration = start_calibration(tables, models, devices=devices, sets=args.calibration_sets, seed=index)
        calibrated, report = calibration.fit()
        log.info("%s task %d: %s", family, index, report.format())
        start = time.perf_counter() - start
        # as ``search --calibrate`` writes it: the calibrated models' plan unless the pre-trained models'
        # measures cheaper (``measured.api.calibrated_search``; the pre-trained plan is "neuroshard")
        plans[CALIBRATED] = calibrated_search(check_task(tables, devices, memory, "neuroshard", 4, index, **ours),
                                              models, calibrated)
        plans[CALIBRATED].provenance["calibration_s"] = start
        others["calibrated"] = calibrated
        if getattr(calibrated.compute, "set_size_coef_", None) is not None:  # the same calibration, uncorrected
            plain = copy.deepcopy(calibrated.compute)
            plain.set_size_coef_ = None
            uncorrected = CostModels(plain, calibrated.comm, calibrated.batch_size, name=calibrated.name + "-uncorrected")
            plans[UNCORRECTED] = search_plan(tables, devices=devices, memory=memory, cost_models=uncorrected,
                                             seed=index, **ours)
        if args.refine_rounds:
            start = time.perf_counter()
            if args.polish_ab:  # refine's plan, polished once, written with and without polish's final check
                from neuroshard.measured.refine import (
                    COMPARE_PASSES,
                    COMPARE_REPEATS,
                    default_polish_steps,
                    final_check,
                    polish,
                )
                chosen = refine(tables, devices, memory, calibration, args.refine_rounds, models=calibrated,
                                seed=index, polish_steps=0, **ours)
                sets = calibration.sim.device_sets(chosen)
                compute = np.zeros(devices)
                used = [d for d, s in enumerate(sets) if s]
                compute[used] = calibration.time([sets[d] for d in used], COMPARE_PASSES, "timing the refined plan",
                                                 COMPARE_REPEATS)
                polished, record = polish(chosen, tables, calibration, calibrated, compute,
                                          default_polish_steps(devices), check=False)
                written = polished
                if polished is not chosen:
                    written, record["final_check"] = final_check(chosen, polished, tables, calibration, calibrated)
                for name, plan in ((REFINED, written), (UNCHECKED, polished)):
                    plan.provenance["refine"] = {**chosen.provenance["refine"], "polish": record}
                    plans[name] = plan
            else:
                plans[REFINED] = refine(tables, devices, memory, calibration, args.refine_rounds, models=calibrated,
                                        seed=index, **ours)
            plans[REFINED].provenance["calibration_s"] = plans[CALIBRATED].provenance["calibration_s"] + (
                time.perf_counter() - start)
            # refine's record (every plan it timed, the finalists' two runs, polish's steps): a task it
            # loses can be traced to its choice or to its candidates
            (Path(args.out) / f"refine_{family}_{devices}dev_task{index}.json").write_text(
                json.dumps(plans[REFINED].provenance["refine"], indent=1, default=str) + "\n")
    if args.refine_budget is not None:  # `search --refine` as a user runs it: the whole loop inside its budget
        from neuroshard.measured.api import measured_search
        plans[REFINED_BUDGET] = measured_search(tables, devices, memory, cost_models=models, seed=index, refine=True,
                                                budget_s=args.refine_budget or None, progress="lines", **ours)
        (Path(args.out) / f"refine_budget_{family}_{devices}dev_task{index}.json").write_text(
            json.dumps(plans[REFINED_BUDGET].provenance["refine"], indent=1, default=str) + "\n")
    for algo in algorithms(args.torchrec):
        params = {"n_trials": args.bayes_trials} if algo == "bayes" else {}
        if algo == "measured-greedy":
            params = {"batch_size": args.batch_size}
        start = time.perf_counter()
        try:
            plans[algo] = search_plan(tables, devices=devices, memory=memory, algorithm=algo, cost_models=models,
                                      seed=index, **(ours if algo == "neuroshard" else network), **params)
        except NeuroShardError as exc:
            log.warning("%s task %d on %d devices: %s found no plan: %s", family, index, devices, algo, exc)
            rows.append({"algorithm": algo, "failed": str(exc).splitlines()[0]})
            continue
        plans[algo].provenance["search_time_s"] = time.perf_counter() - start  # measured-greedy's timing included
    if args.row_blocks != DEFAULT_ROW_BLOCKS:  # the same plain search with TorchRec's layouts, in the same run
        plans[TORCHREC_LAYOUTS] = search_plan(tables, devices=devices, memory=memory, cost_models=models, seed=index,
                                              **network)
    if "measured-greedy" in plans:
        plans[CONTROL] = plans["measured-greedy"]
    # identical plans (e.g. refine keeping a baseline's plan) are timed once and share that measurement:
    # timed separately, the same plan would differ by the run's noise and the "best baseline" (a minimum
    # over noisy measurements) would favour whichever copy drew the lucky draw; the control is timed
    # separately on purpose (it measures that noise)
    first = {}
    for name, plan in plans.items():
        if name != CONTROL:
            first.setdefault(plan.layout_key(), name)
    timed = {n: p for n, p in plans.items() if n == CONTROL or first[p.layout_key()] == n}
    result = measure_plans(timed, tables, cost_models=models, passes=args.passes, repeats=args.repeats,
                           batch_size=args.batch_size, progress=True, reference=not args.no_reference,
                           **({"flush_bytes": 0} if args.warm else {}))
    by_timed = {p.name: p for p in result.plans}
    result.plans = [by_timed[n] if n in timed else dataclasses.replace(by_timed[first[p.layout_key()]], name=n, plan=p)
                    for n, p in plans.items()]
    for p in result.plans:
        rows.append({"algorithm": p.name, "max_compute_ms": p.max_compute_ms, "balance": p.balance,
                     "total_compute_ms": float(sum(p.compute_ms)),
                     "estimated_max_compute_ms": max(p.estimated_compute_ms), "estimate_gmae": p.error_gmae,
                     "estimate_total_ratio": total_ratio(p.estimated_compute_ms, p.compute_ms),
                     "estimate_spearman": p.error_spearman, "max_total_ms": p.max_total_ms,
                     "search_time_s": p.plan.provenance.get("search_time_s", float("nan")),
                     "a2a_bytes_per_device": a2a_bytes_per_device(p.plan, tables.batch_size),
                     "shards": len(p.plan.shards), "failed": "", **split_columns(p.plan, tables),
                     **refine_columns(p.plan.provenance.get("refine", {})),
                     "calibration_s": p.plan.provenance.get("calibration_s", float("nan"))})
        for label, other in others.items():
            sim = Simulator.from_plan(p.plan, other, tables, result.config["batch_size"])
            estimated = sim.evaluate_plan(p.plan).compute_ms[0]
            rows[-1][f"estimate_gmae_{label}"] = estimate_gmae(estimated, p.compute_ms)
            rows[-1][f"estimate_spearman_{label}"] = estimate_spearman(estimated, p.compute_ms)
            rows[-1][f"estimate_total_ratio_{label}"] = total_ratio(estimated, p.compute_ms)
    measured = {r["algorithm"]: r["max_compute_ms"] for r in rows if not r.get("failed")}
    best = min((measured[b] for b in baselines(args.torchrec) if b in measured), default=float("nan"))
    best_bytes = min((r["a2a_bytes_per_device"] for r in rows if r["algorithm"] in baselines(args.torchrec)
                      and not r.get("failed") and measured[r["algorithm"]] == best), default=float("nan"))
    totals = {r["algorithm"]: r["total_compute_ms"] for r in rows if not r.get("failed")}
    least_total = min((totals[b] for b in baselines(args.torchrec) if b in totals), default=float("nan"))
    # the work bound: the least total compute any plan of the task reached, spread evenly
    work_bound = min((t for a, t in totals.items() if a != CONTROL), default=float("nan")) / devices
    for r in rows:
        r.update(family=family, devices=devices, task=index, tables=len(tables), memory_bytes=memory,
                 measure_seconds=result.config["seconds"], hardware=result.config["hardware"])
        if not r.get("failed"):
            r["ratio_to_best_baseline"] = r["max_compute_ms"] / best
            r["total_ratio_to_least_baseline"] = r["total_compute_ms"] / least_total
            r["work_bound_ratio"] = work_bound / best
            r["a2a_ratio_to_best_baseline"] = r["a2a_bytes_per_device"] / best_bytes
    per_device = [{"family": family, "devices": devices, "task": index, "algorithm": p.name, "device": d,
                   "measured_ms": p.compute_ms[d], "estimated_ms": p.estimated_compute_ms[d], "shards": len(on),
                   "rows": sum(s.num_rows for s in on), "width": sum(s.num_cols for s in on)}
                  for p in result.plans for d in range(p.plan.num_devices) for on in [p.plan.shards_on(d)]]
    if CONTROL in measured:
        by_name = {p.name: p.compute_ms for p in result.plans}
        rows.append({**{k: rows[0][k] for k in ("family", "devices", "task", "tables", "memory_bytes",
                                                 "measure_seconds", "hardware")},
                     "algorithm": "A/A", "aa_ratio": measured[CONTROL] / measured["measured-greedy"], "failed": "",
                     # the noise ceiling of a within-plan Spearman: the same plan's devices, measured twice
                     "aa_spearman": estimate_spearman(by_name[CONTROL], by_name["measured-greedy"])})
    return rows, per_device


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per family (and all families together) and algorithm: geometric-mean and worst ratio
    to the best baseline, balance, cost-model error, search time, all-to-all bytes."""
    plans = df[(df["algorithm"] != "A/A") & (df["algorithm"] != CONTROL)].copy()
    for suffix in ("", "_calibrated"):  # each plan's total against the task's other plans: the level removed
        column = f"estimate_total_ratio{suffix}"
        if column in plans:
            level = plans.groupby(["family", "devices", "task"])[column].transform(lambda r: np.exp(np.log(r).mean()))
            plans[f"estimate_total_relative{suffix}"] = plans[column] / level
    out = []
    for family, part in [*plans.groupby("family"), ("all", plans)]:
        for algo, every in part.groupby("algorithm", sort=False):
            g = every[every["failed"] == ""]
            if g.empty:
                continue
            failed = int((every["failed"] != "").sum())
            out.append({"family": family, "algorithm": algo, "tasks": len(g),
                        "ratio_geomean": float(np.exp(np.log(g["ratio_to_best_baseline"]).mean())),
                        "ratio_worst": float(g["ratio_to_best_baseline"].max()),
                        "total_ratio_geomean": (float(np.exp(np.log(g["total_ratio_to_least_baseline"]).mean()))
                                                if g.get("total_ratio_to_least_baseline") is not None
                                                else math.nan),  # rows of runs before the column: none
                        "balance": float(g["balance"].mean()), "estimate_gmae": float(g["estimate_gmae"].mean()),
                        "estimate_spearman": float(g["estimate_spearman"].mean()),
                        "search_time_s": float(g["search_time_s"].mean()),
                        "a2a_MB_per_device": float(g["a2a_bytes_per_device"].mean() / 1e6),
                        "a2a_ratio": float(np.exp(np.log(g["a2a_ratio_to_best_baseline"]).mean())),
                        "no_plan": failed})
            for label in ("also", "calibrated"):
                if f"estimate_gmae_{label}" in g and g[f"estimate_gmae_{label}"].notna().any():
                    out[-1][f"estimate_gmae_{label}"] = float(g[f"estimate_gmae_{label}"].mean())
                    out[-1][f"estimate_spearman_{label}"] = float(g[f"estimate_spearman_{label}"].mean())
            for suffix in ("", "_calibrated"):  # how close a plan's total is predicted
                for kind, column in (("", f"estimate_total_ratio{suffix}"),
                                     ("_relative", f"estimate_total_relative{suffix}")):
                    if column in g and g[column].notna().any():
                        out[-1][f"estimate_total_error{kind}{suffix}"] = total_error(g[column].dropna())
    summary = pd.DataFrame(out)
    bounds = []  # what a perfectly balanced plan with the best baseline's total compute would reach
    for family, part in [*plans.groupby("family"), ("all", plans)]:
        best = part[(part["failed"] == "") & (part["ratio_to_best_baseline"] == 1.0)]
        best = best.drop_duplicates(["family", "devices", "task"])
        if len(best):
            bounds.append({"family": family, "algorithm": "balance bound", "tasks": len(best),
                           "ratio_geomean": float(np.exp(-np.log(best["balance"]).mean())),
                           "ratio_worst": float((1 / best["balance"]).max())})
        tasks = part[part["failed"] == ""].drop_duplicates(["family", "devices", "task"])
        if len(tasks) and "work_bound_ratio" in tasks and tasks["work_bound_ratio"].notna().all():
            bounds.append({"family": family, "algorithm": "work bound", "tasks": len(tasks),
                           "ratio_geomean": float(np.exp(np.log(tasks["work_bound_ratio"]).mean())),
                           "ratio_worst": float(tasks["work_bound_ratio"].max())})
    summary = pd.concat([summary, pd.DataFrame(bounds)], ignore_index=True)
    aa = df[df["algorithm"] == "A/A"]
    if len(aa):
        controls = [{"family": family, "algorithm": "A/A control", "tasks": len(g),
                     "ratio_geomean": float(np.exp(np.log(g["aa_ratio"]).mean())),
                     "ratio_worst": float(g["aa_ratio"].max()),
                     "aa_mean_abs_%": float(100 * (g["aa_ratio"] - 1).abs().mean()),
                     "aa_spearman": float(g["aa_spearman"].mean()) if "aa_spearman" in g else math.nan}
                    for family, g in [*aa.groupby("family"), ("all", aa)]]
        summary = pd.concat([summary, pd.DataFrame(controls)], ignore_index=True)
    return summary


def plot(summary: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = summary[(summary["family"] != "all") & (summary["algorithm"] != "A/A control")]
    table = data.pivot(index="family", columns="algorithm", values="ratio_geomean")
    ax = table.plot.bar(figsize=(11, 4.5), width=0.85)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylim(0.8, max(1.1, float(table.max().max()) + 0.05))
    ax.set_ylabel("measured max-device compute / best baseline\n(geometric mean over tasks)")
    ax.set_title("Plans measured device by device, per table family")
    ax.legend(fontsize=7, ncol=3)
    plt.tight_layout()
    plt.savefig(path, dpi=120)
    plt.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES), choices=sorted(FAMILIES))
    parser.add_argument("--devices", nargs="+", type=int, default=[4, 8, 16])
    parser.add_argument("--tasks", type=int, default=4, help="tasks per family and device count (default: 4)")
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[10, 40], metavar=("MIN", "MAX"))
    parser.add_argument("--passes", type=int, default=TIMING_PASSES,
                        help=f"timed passes of the interleaved run (default: {TIMING_PASSES}, as measure)")
    parser.add_argument("--repeats", type=int, default=TIMING_REPEATS,
                        help=f"runs per device and pass (default: {TIMING_REPEATS}, as measure)")
    parser.add_argument("--batch-size", type=int, default=None, help="batch each device looks up (default: the "
                        "cost models', 4096 for the shipped CPU checkpoint)")
    parser.add_argument("--bayes-trials", type=int, default=48)
    parser.add_argument("--cost-model", default=None, help="checkpoint (default: the shipped one)")
    parser.add_argument("--no-torchrec", dest="torchrec", action="store_false")
    parser.add_argument("--also-model", default=None, metavar="MODEL.pt",
                        help="also plan each task with NeuroShard against this checkpoint ('neuroshard@<name>'), "
                             "and report every plan's estimate error under it (estimate_*_also)")
    parser.add_argument("--calibrate", action="store_true",
                        help="also calibrate the cost models on each task (neuroshard calibrate) and plan it with "
                             "NeuroShard against them ('neuroshard-calibrated'); errors of both models reported")
    parser.add_argument("--calibration-sets", type=int, default=120,
                        help="random sets measured per calibration (default: 120)")
    parser.add_argument("--refine-rounds", type=int, default=2,
                        help="with --calibrate: also NeuroShard refined on this machine for this many rounds "
                             "(measured.refine, from the same calibration; 0: not) (default: 2)")
    parser.add_argument("--refine-budget", nargs="?", const="", default=None, metavar="SECONDS",
                        help="also NeuroShard as `search --refine` writes it: calibration, rounds and stages inside "
                             "the budget (SECONDS; without a value, search's default: 300 s up to 8 devices, "
                             "300 x devices / 8 above); its search_time_s is the loop's whole wall time")
    parser.add_argument("--polish-ab", action="store_true",
                        help="with --refine-rounds: polish refine's plan once and time it both as written (after "
                             "polish's final check against the refined plan: 'neuroshard-refined') and as polished "
                             "('neuroshard-refined-unchecked')")
    parser.add_argument("--row-blocks", choices=ROW_BLOCKS, default=DEFAULT_ROW_BLOCKS,
                        help="row splits our searches may make (any: also 2, 4, ... blocks, which TorchRec does not run)")
    parser.add_argument("--one-host", action="store_true",
                        help="plan for one host of D GPUs: the exchange costed as bytes over NVLink (600 GB/s, "
                             "TorchRec's constant) instead of by the communication models measured on this machine's "
                             "gloo, so the search weighs compute, which is what this benchmark times")
    parser.add_argument("--warm", action="store_true",
                        help="time every plan with a warm cache (no flush before a timed run, as in training, where a "
                             "device's hot rows stay cached between iterations) instead of measure's flushed protocol")
    parser.add_argument("--no-reference", action="store_true",
                        help="time the plans without measure's reference device (each device's fastest raw pass, "
                             "the instrument before the reference device); calibration and refine keep theirs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="1 task per family on 4 devices with 10-15 tables per device")
    parser.add_argument("--out", default=None, help="results folder (default: experiments/results/plans_vs_baselines/"
                                                     "<UTC date>_<devices>dev_seed<seed>; the same --out resumes)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("plan_benchmark").setLevel(logging.INFO)
    logging.getLogger("neuroshard.measured.refine").setLevel(logging.INFO)  # refine's rounds and steps: progress
    if args.quick:
        args.devices, args.tasks, args.tables_per_device = [4], 1, [10, 15]
    args.torchrec = args.torchrec and torchrec_available()
    models = load_cost_models(args.cost_model)
    if args.out is None:
        args.out = str(RESULTS / "plans_vs_baselines" / (f"{source_record()['date']}_"
                                                         f"{'-'.join(map(str, args.devices))}dev_seed{args.seed}"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_source(out)
    csv = out / "tasks.csv"
    done = pd.read_csv(csv) if csv.exists() else pd.DataFrame(columns=["family", "devices", "task"])
    finished = set(zip(done["family"], done["devices"], done["task"]))
    # a resumed run keeps its file's columns (runs before a column was added stay readable)
    columns = list(done.columns) if csv.exists() else COLUMNS
    start = time.perf_counter()
    for devices in args.devices:  # every family at the smallest device count first
        for family in args.families:
            tasks = family_tasks(family, devices, args.tasks, tuple(args.tables_per_device), seed=args.seed)
            for index, (tables, memory) in enumerate(tasks):
                if (family, devices, index) in finished:
                    continue
                t0 = time.perf_counter()
                try:
                    rows, per_device = run_task(family, devices, index, tables, memory, args, models)
                except NeuroShardError as exc:  # e.g. no memory for a device set now: the next tasks still run
                    log.warning("%s, %d devices, task %d failed (a rerun retries it): %s", family, devices, index,
                                str(exc).splitlines()[0])
                    continue
                frame = pd.DataFrame(rows).reindex(columns=columns)
                frame.to_csv(csv, mode="a", header=not csv.exists(), index=False)
                device_csv = out / "devices.csv"
                pd.DataFrame(per_device).to_csv(device_csv, mode="a", header=not device_csv.exists(), index=False)
                ns = frame.set_index("algorithm")
                log.info("%s, %d devices, task %d (%d tables): neuroshard %.3f, A/A %.3f of the best baseline; "
                         "%.0f s", family, devices, index, len(tables),
                         ns["ratio_to_best_baseline"].get("neuroshard", math.nan),
                         ns["aa_ratio"].get("A/A", math.nan) if "aa_ratio" in ns else math.nan,
                         time.perf_counter() - t0)
    df = pd.read_csv(csv)
    df["failed"] = df["failed"].fillna("")
    summary = summarize(df)
    summary.to_csv(out / "summary.csv", index=False)
    plot(summary, out / "ratios.png")
    text = summary.round(3).to_string(index=False)
    hardware = df["hardware"].dropna().iloc[0] if "hardware" in df and df["hardware"].notna().any() else "?"
    (out / "summary.md").write_text(
        f"# Plan benchmark\n\n`python experiments/plan_benchmark.py {' '.join(__import__('sys').argv[1:])}` "
        f"on {hardware}, cost model '{models.name}'; protocol: "
        f"{'warm (no cache flush before a timed run)' if args.warm else 'flushed (measure: the cache flushed before every timed run)'}"
        f"; each device {'its fastest raw pass' if args.no_reference else 'the median of its passes relative to a reference'}"
        f"{'' if args.no_reference else ' device timed before every turn (measure; docs/decisions.md#reference-device)'}"
        f"\n\n```\n{text}\n```\n")
    print(text)
    print(f"wrote {out}/ ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
