"""Is a device's place in its plan signal or noise? (issue 25: what balance the instrument can see)

    python experiments/device_signal.py --family criteo-terabyte --devices 8 --seed 171 --runs 4

One task, the plans of a few algorithms (NeuroShard's with ``--row-blocks any``, the baselines
by name) and an exact copy of the first baseline's plan (an A/A: the same device sets timed
twice in each run), every device of every plan timed together in each of ``--runs`` runs
(``neuroshard measure``'s protocol, one interleaved run each). Per plan and run, each device's
deviation from its plan's mean device, ``log(t / mean)``, is split into

* **signal**: the part that repeats from run to run (the covariance of the deviations between
  runs, averaged over the pairs of runs), what a model or a measured search could act on;
* **noise**: the rest (variance minus that covariance), what no plan can balance away.

Printed per plan: its max/mean in each run and over the runs' per-device medians, the
deviations' signal and noise (standard deviations, %), and the A/A copy's device-by-device
difference (the within-run noise of one device set). Then the figure that matters for a
benchmark ratio: the expected max/mean of a plan whose devices are *perfectly balanced* but
measured with that noise (the mean of the max of ``D`` normal draws, simulated), against the
max/mean the plans measured: the part of a plan's imbalance that is the instrument's.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_composition import add_task_arguments, task_from_args

from neuroshard.runtime.measure_plan import measure_plans

#: the copy of the first baseline's plan, timed beside it in every run
COPY = "copy"
#: a median's standard error over a mean's, for normal draws (sqrt(pi / 2))
MEDIAN_EFFICIENCY = float(np.sqrt(np.pi / 2))


def split_signal(deviations: np.ndarray) -> tuple[float, float]:
    """(signal sd, noise sd) of ``deviations`` (runs, devices): the covariance of the deviations
    between runs, averaged over the pairs of runs, is the signal's variance; the rest is noise."""
    runs = len(deviations)
    total = float(np.mean(np.var(deviations, axis=1)))
    pairs = [float(np.mean(deviations[a] * deviations[b])) for a, b in itertools.combinations(range(runs), 2)]
    signal = max(0.0, float(np.mean(pairs)))
    return float(np.sqrt(signal)), float(np.sqrt(max(0.0, total - signal)))


def balanced_max_over_mean(devices: int, noise_sd: float, draws: int = 20000, seed: int = 0) -> float:
    """The mean max/mean of ``devices`` equal devices each measured with log-normal noise ``noise_sd``."""
    rng = np.random.default_rng(seed)
    t = np.exp(rng.normal(0.0, noise_sd, size=(draws, devices)))
    return float(np.mean(t.max(axis=1) / t.mean(axis=1)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap, seed=171)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--algorithms", nargs="+", default=["lookup", "size-lookup", "neuroshard"],
                    help="the first is copied as the A/A")
    args = ap.parse_args()
    models, tables, _, plans = task_from_args(args, args.algorithms)
    plans[COPY] = plans[args.algorithms[0]]
    print(f"# python experiments/device_signal.py --family {args.family} --devices {args.devices} --seed {args.seed} "
          f"--runs {args.runs} --algorithms {' '.join(args.algorithms)}")
    runs = []  # per run: {plan: (devices,) ms}
    for r in range(args.runs):
        result = measure_plans(plans, tables, cost_models=models)
        runs.append({p.name: np.asarray(p.compute_ms, dtype=np.float64) for p in result.plans})
        print(f"run {r + 1}: " + ", ".join(f"{n} max {t.max():.1f} mean {t.mean():.1f} ms" for n, t in runs[-1].items()),
              flush=True)
    noises = []
    print(f"\n{'plan':14s} {'max/mean per run':28s} {'of medians':>10s} {'signal sd':>9s} {'noise sd':>9s} "
          f"{'total ms (median run)':>21s}")
    for name in plans:
        t = np.array([run[name] for run in runs])  # (runs, devices)
        deviations = np.log(t / t.mean(axis=1, keepdims=True))
        signal, noise = split_signal(deviations)
        if name != COPY:
            noises.append(noise)
        median = np.median(t, axis=0)
        per_run = " ".join(f"{m:.3f}" for m in t.max(axis=1) / t.mean(axis=1))
        print(f"{name:14s} {per_run:28s} {median.max() / median.mean():10.3f} {100 * signal:8.1f}% {100 * noise:8.1f}% "
              f"{float(np.median(t.sum(axis=1))):21.1f}")
    first = np.array([run[args.algorithms[0]] for run in runs])
    copy = np.array([run[COPY] for run in runs])
    aa = np.log(copy / first)
    print(f"\nA/A ({args.algorithms[0]} and its copy, every device, every run): sd of log(copy / original) "
          f"{100 * float(np.std(aa)):.1f}% (one device's within-run noise {100 * float(np.std(aa)) / np.sqrt(2):.1f}%), "
          f"max device copy/original per run {' '.join(f'{c:.3f}' for c in copy.max(axis=1) / first.max(axis=1))}")
    noise = float(np.median(noises))
    print(f"a perfectly balanced plan of {args.devices} devices measured with the plans' median noise "
          f"({100 * noise:.1f}%) shows max/mean {balanced_max_over_mean(args.devices, noise):.3f} in one run, "
          f"{balanced_max_over_mean(args.devices, noise / np.sqrt(args.runs) * MEDIAN_EFFICIENCY):.3f} on the median of "
          f"{args.runs} runs")


if __name__ == "__main__":
    main()
