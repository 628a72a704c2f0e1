"""Calibrate by fine-tuning, or by a set-size correction on the pre-trained members?

Per task (``--families`` on ``--devices``, one task each, searched as one host), ONE
calibration is measured (the task's tables alone and ``--sets`` random device-sized
sets, ``measured.calibrate.start_calibration``) and fitted twice: ``corrected``
(``fine_tune=False``: the pre-trained members, the set-size correction fitted: level and
crowding) and ``fine-tuned`` (the members' weights fine-tuned first). The NeuroShard
search plans against the pre-trained, corrected and fine-tuned models; with
measured-greedy's plan and an A/A control (the pre-trained plan again) every device of
every plan is timed in ONE interleaved run (``measure_plans``). Printed per task: the
held-out random-set error of each calibration (GMAE), each plan's slowest device over
measured-greedy's (shards in brackets), and each model's per-device error (GMAE) on the
devices of the four plans.

    python experiments/calibration_modes.py --families criteo-terabyte criteo-kaggle dlrm-2021 --devices 4 8 --seed 41

Writes ``--out``/calibration_modes.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from common import write_source
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.samples.store import cpu_model
from neuroshard.costmodels.metrics import gmae
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.measured.calibrate import start_calibration
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.search.api import search_plan
from neuroshard.search.simulator import Simulator
from neuroshard.topology import Topology

PLANS = ("pretrained", "corrected", "fine-tuned", "measured-greedy", "A/A")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["criteo-terabyte", "criteo-kaggle", "dlrm-2021"],
                        choices=sorted(FAMILIES))
    parser.add_argument("--devices", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--tables-per-device", nargs=2, type=int, default=[10, 20])
    parser.add_argument("--sets", type=int, default=120, help="random sets per calibration (default: 120)")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--out", default="experiments/results/calibration_modes")
    args = parser.parse_args()
    models = load_cost_models()
    lines, ratios = [], {n: [] for n in PLANS}
    for family in args.families:
        for devices in args.devices:
            tables, memory = family_tasks(family, devices, 1, tuple(args.tables_per_device), seed=args.seed)[0]
            tables = tables.at_batch(models.batch_size)
            topology = Topology(devices, local_world_size=devices)
            calibration = start_calibration(tables, models, devices=devices, sets=args.sets, seed=0)
            fine_tuned, fine_report = calibration.fit(fine_tune=True)
            corrected, corrected_report = calibration.fit(fine_tune=False)
            by_name = {"pretrained": models, "corrected": corrected, "fine-tuned": fine_tuned}
            plans = {n: search_plan(tables, devices, memory, cost_models=m,
                                    topology=topology) for n, m in by_name.items()}
            plans["measured-greedy"] = search_plan(tables, devices, memory, algorithm="measured-greedy",
                                                   cost_models=models,
                                                   topology=topology)
            plans["A/A"] = plans["pretrained"]
            measured = measure_plans(plans, tables, cost_models=models, passes=args.passes)
            best = measured["measured-greedy"].max_compute_ms
            line = (f"| {tables.name} | {corrected_report.gmae_before:.3f} | {corrected_report.gmae_after:.3f} | "
                    f"{fine_report.gmae_after:.3f} |")
            for name in PLANS:
                ratio = measured[name].max_compute_ms / best
                ratios[name].append(ratio)
                line += f" {ratio:.3f} ({len(plans[name].shards)}) |"
            for name, model in by_name.items():  # each model's error on the devices of the four plans
                errors = []
                for plan_name in PLANS[:4]:
                    plan = plans[plan_name]
                    estimate = Simulator.from_plan(plan, model, tables, models.batch_size).evaluate_plan(plan)
                    errors.append(gmae(estimate.compute_ms[0], np.array(measured[plan_name].compute_ms)))
                line += f" {', '.join(f'{e:.2f}' for e in errors)} |"
            print(line, flush=True)
            lines.append(line)
    summary = " | ".join(f"{n} {np.exp(np.mean(np.log(r))):.3f} (worst {max(r):.3f})" for n, r in ratios.items())
    print(summary)
    header = ("| task | held-out GMAE pre-trained | corrected | fine-tuned | " + " | ".join(PLANS) +
              " | device GMAE: pre-trained model | corrected | fine-tuned |\n|" + "---|" * (4 + len(PLANS) + 3))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_source(out)
    cmd = (f"python experiments/calibration_modes.py --families {' '.join(args.families)} --devices "
           f"{' '.join(map(str, args.devices))} --sets {args.sets} --passes {args.passes} --seed {args.seed}")
    (out / "calibration_modes.md").write_text(
        f"# Calibration modes\n\n`{cmd}`\n\nMachine: {cpu_model()}; batch {models.batch_size}; plans searched as one "
        f"host; ratios are the slowest device over measured-greedy's (shards in brackets); device GMAE over the "
        f"devices of the pre-trained, corrected, fine-tuned and measured-greedy plans.\n\n{header}\n"
        + "\n".join(lines) + f"\n\nGeometric mean over tasks: {summary}\n")


if __name__ == "__main__":
    main()
