"""``neuroshard demo``: a small end-to-end run on the shipped defaults.

Generate calibrated benchmark tables, search a plan with NeuroShard and with the
classic greedy baselines, show the per-device tables and the improvement over the
best baseline, then run both plans on the training runtime (gloo processes on
this machine) to measure what each device really spends, and draw a figure.

NeuroShard's plan is ``search --refine 1 --judge runtime``'s by default (``--refine 0``:
the search alone): on the demo's 12 tables the plans differ by a swap or two, the model's
margin between them is smaller than its error, and the measured loop decides: it times its
plans and the baselines' on this machine (the kernel alone, caches flushed), polishes the
cheapest, then trains them all together on the runtime (compute and all-to-all, warm) and
keeps the one measured cheapest there. A fresh run then measures our plan beside every
distinct baseline plan and beside itself (the A/A control), one plan at a time, two plans'
embeddings per process (``runtime.evaluate.measure_paired``); the best baseline is the one
measured fastest against ours.

The measured loop, its calibration included, runs within ``--budget`` (default
``DEMO_BUDGET_S``): stages that do not fit are skipped and the plan says which. The whole demo is
sized to end within ``DEMO_TARGET_S`` on 2 cores (the comparison's runs and iterations), and each
stage says how long it took. The last line says whether NeuroShard's plan measured faster than
the best baseline outside the A/A noise band. Progress is one line on a terminal (plain lines in
a log; ``-q``: none).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from .constants import TURN_STEPS
from .costmodels import load_cost_models
from .costmodels.samples.store import cpu_model, same_cpu
from .datasets.synthetic import generate
from .errors import NeuroShardError
from .cli_options import progress_mode
from .measured.api import measured_search
from .measured.budget import EXIT_STOPPED, Budget, format_budget, stop_on_sigterm
from .measured.calibrate import calibrated_models, start_calibration
from .measured.config import DEMO_BUDGET_S, DEMO_ITERATIONS, DEMO_RUNS, DEMO_TARGET_S
from .measured.judge import geometric_mean
from .measured.refine import format_judgement
from .runtime.evaluate import PairedRuns, measure_paired, paired_improvement
from .runtime.judge import RuntimeJudge
from .search.registry import GREEDY_ALGORITHMS
from .search.score import score_plan
from .validate import check_output_folder

#: random sets timed when the demo calibrates (a few seconds for its tables)
DEMO_CALIBRATION_SETS = 48


def _improvement(best_baseline: float, ours: float) -> str:
    return f"{100.0 * (best_baseline - ours) / best_baseline:+.1f}%"


def _took(since: float) -> str:
    return f"({time.monotonic() - since:.0f} s)"


def run_demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    args.runs = DEMO_RUNS if args.runs is None else args.runs
    args.iterations = DEMO_ITERATIONS if args.iterations is None else args.iterations
    if args.devices is None:
        # A runtime device is a process running one thread: with more processes than cores they
        # time-share the cores and the measured comparison stops meaning "D parallel devices".
        args.devices = max(2, min(4, os.cpu_count() or 2))
    if args.num_tables is None:
        # A small task: the demo runs both plans on the training runtime in a few minutes.
        args.num_tables = 6 * args.devices
    out = check_output_folder(args.out, "demo folder")
    if args.devices < 2:
        raise NeuroShardError(f"the demo compares plans across devices: --devices must be >= 2, got {args.devices}")
    out.mkdir(parents=True, exist_ok=True)
    models = load_cost_models()
    print(f"== 1. tables: {args.num_tables} tables from the calibrated dlrm-2021 preset (seed {args.seed})")
    tables = generate("dlrm-2021", num_tables=args.num_tables, seed=args.seed)
    # The runtime measures at the cost models' batch size, so plans are searched for it too:
    # predicted and measured per-device costs are then directly comparable.
    tables.batch_size = models.batch_size
    tables.write(out / "tables.json")
    total = tables.total_bytes()
    memory = int(1.25 * total / args.devices)
    print(f"   {out / 'tables.json'}: {total / 2**30:.1f} GiB in fp32, batch {tables.batch_size}; "
          f"{args.devices} devices of {memory / 2**30:.2f} GiB each {_took(started)}")

    measured_on = models.hardware.get("hardware", {}).get("cpu_model", "unknown hardware")
    here = cpu_model()
    pretrained = models
    same = same_cpu(models.hardware)
    if here == measured_on and not same:
        here += " (another last-level cache)"
    sets = (0 if same else DEMO_CALIBRATION_SETS) if args.calibrate is None else args.calibrate
    calibration = None
    # the measured loop's budget starts before its calibration: it bounds both
    budget = (Budget.for_task(args.devices, DEMO_BUDGET_S if args.budget is None else args.budget,
                              progress_mode(args)) if args.refine else None)
    calibrated = time.monotonic()
    if sets or args.refine:
        if sets:
            print(f"\n== 1b. calibrate: the checkpoint was measured on {measured_on}, this is {here}: timing the "
                  f"tables here and correcting the cost models" + ("" if args.refine else " (cached for the next run)"))
        if args.refine:
            # one calibration serves the baselines' models and the refine rounds (timed once, not twice)
            with stop_on_sigterm():
                calibration = start_calibration(tables, pretrained, devices=args.devices, seed=args.seed,
                                                sets=sets or DEMO_CALIBRATION_SETS, budget=budget)
            if sets and calibration.fittable:
                models, report = calibration.fit()
                print(report.format())
            elif sets:
                print("   calibration did not fit the budget: the baselines are searched with the pre-trained models")
        else:
            models = calibrated_models(tables, models, devices=args.devices, sets=sets)
        print("   calibration" + (" (refine's, inside its budget)" if args.refine else "") + f" {_took(calibrated)}")
    searched = time.monotonic()
    print(f"\n== 2. search with cost models '{models.name}' (measured at batch {models.batch_size} on "
          f"{measured_on})")
    plans = {}
    # --refine's last word goes to the training runtime: the kernel alone (caches flushed) and the
    # runtime's step ranked the demo's plans differently (refine kept size-lookup's plan, the runtime
    # measured it 2.8% slower than lookup's, A/A 0.2%, 2026-11-27, Intel Xeon)
    judge = RuntimeJudge(runs=args.runs, iterations=args.iterations) if args.refine else None
    for algorithm in ("neuroshard", *GREEDY_ALGORITHMS):
        if algorithm == "neuroshard" and args.refine:
            # --refine (the measured loop): our searched plans timed on this machine with the
            # baselines' (measured-greedy's too), the kernel's choice polished, then all of them
            # trained together on the runtime, the one measured cheapest there kept
            with stop_on_sigterm():
                refined = measured_search(tables, devices=args.devices, memory=memory, algorithm=algorithm,
                                          cost_models=pretrained, seed=args.seed, refine=args.refine,
                                          calibration=calibration, judge=judge, budget_s=budget)
            stopped = refined.provenance["refine"].get("stopped")
            if stopped:  # Ctrl-C or SIGTERM: the best plan so far is written, and the demo ends there
                refined.write(out / "plan-neuroshard.json")
                print(f"   {format_budget(refined.provenance['refine'])}\n== stopped: the best plan so far is "
                      f"{out / 'plan-neuroshard.json'}")
                return EXIT_STOPPED[stopped]
            # estimated by the models the baselines are, so that the simulated costs compare
            plans[algorithm] = score_plan(refined, tables, models)
        else:
            plans[algorithm] = measured_search(tables, devices=args.devices, memory=memory, algorithm=algorithm,
                                               cost_models=models, seed=args.seed)
        plans[algorithm].write(out / f"plan-{algorithm}.json")
    simulated = {a: p.estimate["max_device_cost_ms"] for a, p in plans.items()}
    for a, cost in simulated.items():
        print(f"   {a:<12} simulated max device cost {cost:9.3f} ms   search "
              f"{plans[a].provenance['search_time_s']:.2f} s")
    refine_record = plans["neuroshard"].provenance.get("refine")
    if refine_record and not any("final_measured_cost_ms" in e for e in refine_record["rounds"]
                                 + refine_record["compared"]):
        print(f"   neuroshard --refine {args.refine}: no plans timed together within the budget; written: "
              f"{refine_record['chosen']}'s plan (the plain search's)")
    elif refine_record:
        trained = "plans" in refine_record.get("judge", {})  # the runtime judge ran (not skipped for the budget)
        print(f"   neuroshard --refine {args.refine}: its plans and the baselines' timed on this machine "
              f"({refine_record['hardware']})" + (", then trained on the runtime, the first beside each other"
                                                  if trained else "") +
              f"; kept the one measured cheapest: {refine_record['chosen']}")
        if "judge" in refine_record:
            print(f"   {format_judgement(refine_record['judge'])}")
        print(f"   {format_budget(refine_record)}")
    print("   searches" + (" and the rest of refine" if refine_record else "") + f" {_took(searched)}")
    print(f"\n-- NeuroShard plan ({out / 'plan-neuroshard.json'})\n{plans['neuroshard'].format_summary()}")

    # every distinct baseline plan runs beside ours; the best baseline is the one measured fastest
    measured_as = {"neuroshard": "neuroshard"}  # plan name -> the name its (identical) plan is measured under
    runnable = {"neuroshard": plans["neuroshard"]}
    for algorithm in GREEDY_ALGORITHMS:
        twin = next((n for n, p in runnable.items() if p.layout_key() == plans[algorithm].layout_key()), None)
        measured_as[algorithm] = twin or algorithm
        runnable.setdefault(measured_as[algorithm], plans[algorithm])
    control = "neuroshard again"  # the A/A control: our plan built and measured a second time
    runnable[control] = plans["neuroshard"]
    compared = time.monotonic()
    print(f"\n== 3. run the plans on the training runtime: {args.devices} gloo processes, batch "
          f"{models.batch_size}; ours beside each of the {len(runnable) - 1} other plans in turn (the distinct "
          f"baselines' and ours again, an A/A control: the noise of one comparison), the two taking turns of "
          f"{TURN_STEPS} steps, {args.runs} runs of {args.iterations} measured iterations each; two plans' "
          f"embeddings per process")
    runs = _compare_on_runtime(runnable, tables, args, models.batch_size)
    scaled = runs.costs_ms()
    costs = {a: scaled[measured_as.get(a, a)] for a in (*measured_as, control)}
    baseline = min(GREEDY_ALGORITHMS, key=lambda a: geometric_mean(costs[a]))
    print(f"   measured {_took(compared)}, geometric mean of the runs' slowest device (a plan's ratio to ours in "
          f"the steps they shared, times ours): " + "; ".join(
        f"{a} {geometric_mean(costs[a]):.1f} ms" + (f" (= {measured_as[a]}'s plan)" if measured_as[a] != a else "")
        for a in measured_as))
    print(f"\n-- best baseline (measured fastest): {baseline} ({out / f'plan-{baseline}.json'})\n"
          f"{plans[baseline].format_summary()}")
    print(f"\n   simulated improvement of NeuroShard over {baseline}: "
          f"{_improvement(simulated[baseline], simulated['neuroshard'])}")
    measured = {}
    same_plan = measured_as[baseline] == "neuroshard"
    for algorithm in ("neuroshard", baseline):  # ours: the runs beside the best baseline
        results = (runs.measurements(measured_as[baseline]) if algorithm == baseline else
                   runs.measurements("neuroshard", beside=None if same_plan else measured_as[baseline]))
        measured[algorithm] = min(results, key=lambda m: abs(m.max_device_cost_ms - _median(results)))
        measured[algorithm].write_json(out / f"measured-{algorithm}.json")
        print(f"\n-- {algorithm} (the median run; max device cost per run: "
              f"{', '.join(f'{m.max_device_cost_ms:.1f}' for m in results)} ms)\n{measured[algorithm].format()}")
    gain = paired_improvement(costs["neuroshard"], costs[baseline])
    # The noise band: the A/A's largest deviation in one run, not only its geometric mean. Two demo
    # runs (2026-11-27, Intel Xeon) put ours and lookup's plan in opposite orders while each A/A's
    # geometric mean was 1.0-1.7%: its runs deviated by up to 4.4%, the mean of 3 hid it by luck.
    # The largest of 3 one-run deviations is about twice the 3-run mean's standard error.
    aa_mean = abs(paired_improvement(costs[control], costs["neuroshard"]))
    aa_runs = [abs(paired_improvement([again], [ours])) for again, ours in zip(costs[control], costs["neuroshard"])]
    noise = max(aa_mean, *aa_runs)
    same = same_plan
    verdict = (f"the same plan as {baseline}'s (refine kept it)" if same else
               "inside the noise: no measured difference" if abs(gain) <= noise else
               "NeuroShard's plan is faster" if gain > 0 else f"NeuroShard's plan is slower than {baseline}'s")
    print(f"\n   measured improvement of NeuroShard over {baseline}: {100 * gain:+.1f}% (paired runs: one minus the "
          f"geometric mean of the per-run cost ratios)\n   A/A control (NeuroShard against itself): "
          f"{100 * aa_mean:.1f}% on the geometric mean, up to {100 * max(aa_runs):.1f}% in one run: a noise band of "
          f"{100 * noise:.1f}%; {verdict}")

    figure = _plot(plans, measured, baseline, out / "demo-per-device.png")
    summary = {"simulated_ms": simulated, "best_baseline": baseline, "best_baseline_by": "measured",
               "devices": args.devices, "same_plan": same,
               "measured_ms": costs, "measured_ms_scale": "each plan's ratio to ours in their shared steps, "
               "times ours", "measured_improvement": gain, "aa_noise": noise,
               "aa_geomean": aa_mean, "aa_runs": aa_runs,
               "refine": {"rounds": args.refine, "chosen": refine_record["chosen"]} if refine_record else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n   plans, measurements and {figure} are in {out}/")
    took = time.monotonic() - started
    if took > DEMO_TARGET_S:
        print(f"   the demo took longer than the {DEMO_TARGET_S:.0f} s it is sized for (a busy machine?): "
              f"--budget and --runs/--iterations shorten it")
    print(f"== done in {took // 60:.0f} min {took % 60:.0f} s: " + _last_word(gain, noise, baseline, same))
    return 0


def _last_word(gain: float, noise: float, baseline: str, same: bool) -> str:
    """The demo's last line: was NeuroShard's plan measured faster than the best baseline, outside
    the A/A noise band (``gain``: the paired improvement; ``noise``: the band)?"""
    if same:
        return f"NeuroShard wrote {baseline}'s own plan: nothing to tell apart"
    if abs(gain) <= noise:
        return (f"NeuroShard's plan was not measured faster than {baseline}'s: {100 * gain:+.1f}%, inside the A/A "
                f"noise band of {100 * noise:.1f}%")
    return (f"NeuroShard's plan was measured {'faster' if gain > 0 else 'slower'} than {baseline}'s: "
            f"{100 * gain:+.1f}%, outside the A/A noise band of {100 * noise:.1f}%")


def _compare_on_runtime(runnable: dict, tables, args: argparse.Namespace, batch_size: int) -> PairedRuns:
    """``measure_paired``'s runs: ours (the first of ``runnable``) beside each other plan in turn,
    in one launch; rank 0's progress line says which."""
    return measure_paired(runnable, tables, runs=args.runs, iterations=args.iterations, devices=args.devices,
                          batch_size=batch_size, progress=progress_mode(args), progress_prefix="demo")


def _median(results) -> float:
    import statistics
    return statistics.median(m.max_device_cost_ms for m in results)


def _plot(plans, measured, baseline: str, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, algorithm in zip(axes, ("neuroshard", baseline)):
        predicted = np.asarray(plans[algorithm].estimate["per_device_cost_ms"])
        real = np.asarray(measured[algorithm].per_device_cost_ms)
        x = np.arange(len(real))
        ax.bar(x - 0.2, predicted, 0.4, label="predicted")
        ax.bar(x + 0.2, real, 0.4, label="measured")
        ax.set_title(f"{algorithm}: max {real.max():.1f} ms measured")
        ax.set_xlabel("device")
        ax.set_xticks(x)
    axes[0].set_ylabel("embedding cost per iteration (ms)")
    # above the panels, clear of every bar
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=2, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
