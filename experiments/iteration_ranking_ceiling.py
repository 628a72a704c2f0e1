"""Issue 31, item 6, from the stored runs in turns (no timing): how often could even a perfect
predictor name the fastest plan of a decided set, with the instrument's noise as it is?

    python experiments/iteration_ranking_ceiling.py [--draws 4000] [--noise-scale 1 0.5]

Item 6 counts a set as decided when its two fastest plans differ by more than the A/A noise
(``iteration_stored_ranking.ranking``: the plan fastest in both runs, its lead over the second at
least the set's median |log(run 1 / run 2)|). A lead of one noise unit is often noise itself: with
six plans of a set within a few percent of each other, the plan measured fastest is often not the
one that trains fastest. This script asks what that costs a predictor that makes no error at all.

Per stored set (every ``configs.jsonl`` of ``iteration_stored_ranking.TURN_RUNS``):

* the per-run noise ``s`` of its plans: the set's median |log(run 1 / run 2)| / (0.6745 x sqrt 2)
  (a normal difference of two runs), times ``--noise-scale`` (0.5: runs four times as long, if the
  noise were independent from step to step);
* the plans' true steps: their measured means, in log, either *as measured* or *shrunk* toward
  the set's mean by the share of their spread the noise explains (the measured spread carries
  the noise too: ``var_true = var_measured - s^2 / 2``, at least 0);
* ``--draws`` times: two runs drawn as ``true + N(0, s)`` per plan, the set judged by the rule
  above; a decided set counts *right* when its measured fastest is the truly fastest plan (the
  pick of a perfect predictor).

Printed per processes and truth: decided sets per draw and the right share of decided sets: the
ceiling of item 6's figure for this instrument and these sets. The model's own share is printed
beside it (``ranking`` with the shipped predictions, as ``iteration_stored_ranking.py --turns``),
and the share a predictor whose within-set error is ``e`` would reach, for the model's estimated
``e`` (its within-set error less the noise's part).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_stored_ranking import RESULTS, TURN_RUNS

#: a normal variable's median absolute value over its standard deviation
MEDIAN_ABS = 0.6745


def stored_sets() -> list[dict]:
    """Every stored set in turns: processes, plans, log measured means, runs, stored predictions."""
    sets = []
    for _, run in TURN_RUNS:
        path = RESULTS / run / "configs.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if line.strip():
                c = json.loads(line)
                plans = c["plans"]
                sets.append({"run": run, "seed": c["seed"], "ranks": c["devices"],
                             "run1": np.log([p["run1_ms"] for p in plans]),
                             "run2": np.log([p["run2_ms"] for p in plans]),
                             "predicted": np.log([p["predicted_ms"] for p in plans])})
    return sets


def decide(run1: np.ndarray, run2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule of ``iteration_stored_ranking.ranking`` over draws (rows): (decided, measured fastest)."""
    mean = 0.5 * (run1 + run2)
    noise = np.median(np.abs(run1 - run2), axis=1)
    order = np.argsort(mean, axis=1)
    first, second = order[:, 0], order[:, 1]
    rows = np.arange(len(mean))
    lead = mean[rows, second] - mean[rows, first]
    agree = (np.argmin(run1, axis=1) == first) & (np.argmin(run2, axis=1) == first)
    return agree & (lead >= noise), first


def simulate(s: dict, draws: int, scale: float, shrink: bool, model_error: float, rng) -> tuple[float, float, float]:
    """(decided per draw, right by a perfect predictor, right by one of within-set error ``model_error``)."""
    sigma = scale * float(np.median(np.abs(s["run1"] - s["run2"]))) / (MEDIAN_ABS * np.sqrt(2))
    truth = 0.5 * (s["run1"] + s["run2"])
    if shrink:
        centred = truth - truth.mean()
        spread = centred.var()
        keep = np.sqrt(max(0.0, spread - 0.5 * sigma ** 2 / scale ** 2) / spread) if spread > 0 else 0.0
        truth = truth.mean() + keep * centred
    n = len(truth)
    run1 = truth + rng.normal(0.0, sigma, (draws, n))
    run2 = truth + rng.normal(0.0, sigma, (draws, n))
    decided, first = decide(run1, run2)
    best = int(np.argmin(truth))
    pick = np.argmin(truth + rng.normal(0.0, model_error, (draws, n)), axis=1)
    return float(decided.mean()), float((decided & (first == best)).sum()), float((decided & (first == pick)).sum())


def model_share(sets: list[dict]) -> tuple[int, int]:
    """(right, decided) of the stored predictions on the stored runs."""
    right = decided = 0
    for s in sets:
        ok, first = decide(s["run1"][None], s["run2"][None])
        if ok[0]:
            decided += 1
            right += int(np.argmin(s["predicted"]) == first[0])
    return right, decided


def within_error(sets: list[dict]) -> tuple[float, float]:
    """The stored predictions' within-set error (sd of log(measured / predicted) about the set's
    mean) and the part the noise of a two-run mean explains, pooled over the sets."""
    errors, noise = [], []
    for s in sets:
        r = 0.5 * (s["run1"] + s["run2"]) - s["predicted"]
        errors.extend(r - r.mean())
        sigma = float(np.median(np.abs(s["run1"] - s["run2"]))) / (MEDIAN_ABS * np.sqrt(2))
        noise.append(0.5 * sigma ** 2 * (1 - 1 / len(r)))
    return float(np.std(errors)), float(np.sqrt(np.mean(noise)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--noise-scale", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    sets = stored_sets()
    by_ranks = defaultdict(list)
    for s in sets:
        by_ranks[s["ranks"]].append(s)
    print(f"{len(sets)} stored sets in turns ({', '.join(f'{len(v)} at {k} processes' for k, v in sorted(by_ranks.items()))})")
    for ranks, among in sorted(by_ranks.items()):
        right, decided = model_share(among)
        total, noise = within_error(among)
        own = float(np.sqrt(max(0.0, total ** 2 - noise ** 2)))
        print(f"\n{ranks} processes, {len(among)} sets: the model right in {right} of {decided} decided sets "
              f"({100 * right / max(decided, 1):.0f}%); its within-set error {100 * total:.2f}% (sd of log), "
              f"the noise's part {100 * noise:.2f}%, its own about {100 * own:.2f}%")
        for scale in args.noise_scale:
            for shrink in (False, True):
                decided_per_set, perfect, estimated = [], 0.0, 0.0
                for s in among:
                    d, p, e = simulate(s, args.draws, scale, shrink, own, rng)
                    decided_per_set.append(d)
                    perfect += p
                    estimated += e
                n_decided = sum(decided_per_set) * args.draws
                print(f"  noise x{scale:g}, true steps {'shrunk' if shrink else 'as measured'}: "
                      f"{sum(decided_per_set):.1f} of {len(among)} sets decided per draw; right share of decided sets: "
                      f"perfect predictor {100 * perfect / n_decided:.1f}%, one with the model's own error "
                      f"{100 * estimated / n_decided:.1f}%")


if __name__ == "__main__":
    main()
