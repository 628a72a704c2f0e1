"""How often could even a perfect predictor name the fastest plan of a decided set, with the
instrument's noise as it is? From the iteration benchmark's stored runs in turns (no timing).

    python experiments/iteration_ranking_ceiling.py [--draws 4000] [--noise-scale 1 0.5] [--margins 1 2]

A set counts as decided when its two fastest plans differ by more than the A/A noise
(``common.decide``: the plan fastest in both runs, its lead over the second at least the set's
median |log(run 1 / run 2)|). A lead of one noise unit is often noise itself: with six plans of a
set within a few percent of each other, the plan measured fastest is often not the one that trains
fastest. This script asks what that costs a predictor that makes no error at all.

Per stored set (``common.iteration_sets``: every suite of ``results/iteration_model``):

* its run-level shift, the mean log(run 1 / run 2) over its plans: the machine's drift between the
  two runs, common to every plan of a run (it is in the A/A noise, but no part of comparing two
  plans of one run);
* the per-plan noise ``s`` left about that shift (a robust sd of log per run), times
  ``--noise-scale`` (0.5: what runs four times as long would give if the noise were independent
  from step to step);
* the plans' true steps: their measured means, in log, either *as measured* or *shrunk* toward
  the set's mean by the share of their spread the noise explains;
* ``--draws`` times: two runs drawn as ``true +/- shift / 2 + N(0, s)`` per plan, the set judged
  by the rule above (or with the drift taken off the A/A noise: ``drift-free``); a decided set
  counts *right* when its measured fastest is the truly fastest plan (the pick of a perfect
  predictor).

Printed per processes: the model's within-set error (sd of log(measured / predicted) about each
set's mean), the part the per-plan noise explains and its own; per rule and noise, the decided
sets per draw and the right share of decided sets, for a perfect predictor and for one with the
model's own within-set error; the share of predictors with ``--model-errors``; and the model's
own share on the stored runs. ``--margins``: the lead a decided set needs, in noise units (the
ranking test says 1).

Last, per processes, every pair of plans of a set by how far apart they were predicted: how often
the pair trained in the predicted order (the mean of the two runs). Under 3% apart at 2 processes
the order is little better than a coin (``constants.ITERATION_TIE_MARGIN``, the tie ``search
--objective iteration`` reports; docs/decisions.md#tie-margin).

Written to ``--out`` (default ``results/iteration_model/ceiling``): ``output.txt`` (what is printed),
``ceiling.json`` (the same figures, read by ``report.py``) and ``SOURCE.json``.
"""
from __future__ import annotations

import argparse
import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from common import RESULTS, decide, iteration_sets, write_source

#: a normal variable's median absolute value over its standard deviation
MEDIAN_ABS = 0.6745


def stored_sets() -> list[dict]:
    """Every stored set in turns (``common.iteration_sets``), its steps in log."""
    return [{**c, "run": c["suite"], "run1": np.log(c["run1"]), "run2": np.log(c["run2"]),
             "predicted": np.log(c["predicted"])} for c in iteration_sets()]


def relative_noise(s: dict, scale: float = 1.0) -> tuple[float, float]:
    """(shift, sigma): the set's run-level shift (mean log(run 1 / run 2) over its plans: the
    machine's drift between the two runs, common to every plan of a run and so no part of a
    comparison inside one) and the per-plan noise left about it (a robust sd of log, per run),
    times ``scale``."""
    d = s["run1"] - s["run2"]
    shift = float(d.mean())
    n = len(d)
    sigma = float(np.median(np.abs(d - shift))) / (MEDIAN_ABS * np.sqrt(2 * (1 - 1 / n)))
    return shift, scale * sigma


def simulate(s: dict, draws: int, scale: float, shrink: bool, model_error: float, rng,
             margin: float = 1.0, drift_free: bool = False) -> tuple[float, float, float]:
    """(decided per draw, right by a perfect predictor, right by one of within-set error
    ``model_error``): two runs drawn as the true steps, the set's measured shift between its runs,
    and independent per-plan noise (``relative_noise``)."""
    shift, sigma = relative_noise(s, scale)
    truth = 0.5 * (s["run1"] + s["run2"])
    if shrink:
        centred = truth - truth.mean()
        spread = centred.var()
        noise_var = 0.5 * (sigma / scale) ** 2 * (1 - 1 / len(truth))
        keep = np.sqrt(max(0.0, spread - noise_var) / spread) if spread > 0 else 0.0
        truth = truth.mean() + keep * centred
    n = len(truth)
    run1 = truth + 0.5 * shift + rng.normal(0.0, sigma, (draws, n))
    run2 = truth - 0.5 * shift + rng.normal(0.0, sigma, (draws, n))
    decided, first = decide(run1, run2, margin, drift_free)
    best = int(np.argmin(truth))
    pick = np.argmin(truth + rng.normal(0.0, model_error, (draws, n)), axis=1)
    return float(decided.mean()), float((decided & (first == best)).sum()), float((decided & (first == pick)).sum())


def simulate_sets(sets: list[dict], draws: int, scale: float, shrink: bool, model_error: float, rng,
                  margin: float = 1.0, drift_free: bool = False) -> tuple[float, float, float]:
    """``simulate`` over ``sets``, in order: (decided sets per draw, the right share of decided sets
    of a perfect predictor, of one with within-set error ``model_error``)."""
    decided = perfect = estimated = 0.0
    for s in sets:
        d, p, e = simulate(s, draws, scale, shrink, model_error, rng, margin, drift_free)
        decided, perfect, estimated = decided + d, perfect + p, estimated + e
    n_decided = max(decided * draws, 1)
    return decided, perfect / n_decided, estimated / n_decided


def model_share(sets: list[dict], margin: float = 1.0, drift_free: bool = False) -> tuple[int, int]:
    """(right, decided) of the stored predictions on the stored runs."""
    right = decided = 0
    for s in sets:
        ok, first = decide(s["run1"][None], s["run2"][None], margin, drift_free)
        if ok[0]:
            decided += 1
            right += int(np.argmin(s["predicted"]) == first[0])
    return right, decided


def within_error(sets: list[dict]) -> tuple[float, float]:
    """The stored predictions' within-set error (sd of log(measured / predicted) about the set's
    mean) and the part the per-plan noise of a two-run mean explains (``relative_noise``), pooled."""
    errors, noise = [], []
    for s in sets:
        r = 0.5 * (s["run1"] + s["run2"]) - s["predicted"]
        errors.extend(r - r.mean())
        _, sigma = relative_noise(s)
        noise.append(0.5 * sigma ** 2 * (1 - 1 / len(r)))
    return float(np.std(errors)), float(np.sqrt(np.mean(noise)))


#: bands of the predicted gap between two plans of a set (fractions)
GAP_BANDS = ((0.0, 0.01), (0.01, 0.02), (0.02, 0.03), (0.03, 0.05), (0.05, 0.10), (0.10, np.inf))


def pair_agreement(sets: list[dict], bands=GAP_BANDS) -> list[tuple[float, float, int, float]]:
    """Per band of predicted gaps (``GAP_BANDS``): (low, high, pairs, share measured in the predicted order)."""
    gaps, agree = [], []
    for s in sets:
        measured = 0.5 * (s["run1"] + s["run2"])
        for i in range(len(measured)):
            for j in range(i + 1, len(measured)):
                predicted = s["predicted"][i] - s["predicted"][j]
                gaps.append(abs(predicted))
                agree.append(np.sign(predicted) == np.sign(measured[i] - measured[j]))
    gaps, agree = np.array(gaps), np.array(agree)
    out = []
    for low, high in bands:
        band = (gaps >= np.log1p(low)) & (gaps < np.log1p(high))
        out.append((low, high, int(band.sum()), float(agree[band].mean()) if band.any() else float("nan")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--noise-scale", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--margins", type=float, nargs="+", default=[1.0, 2.0],
                    help="the lead a decided set needs, in A/A noise units (the ranking test: 1)")
    ap.add_argument("--model-errors", type=float, nargs="*", default=[0.005, 0.01, 0.015],
                    help="within-set errors (sd of log) of hypothetical predictors, scored like the model's own")
    ap.add_argument("--runs", nargs="*", default=None, help="stored suites to take (default: all in turns)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "iteration_model" / "ceiling")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    sets = [s for s in stored_sets() if args.runs is None or s["run"] in args.runs]
    by_ranks = defaultdict(list)
    for s in sets:
        by_ranks[s["ranks"]].append(s)
    lines, record = [], {"draws": args.draws, "seed": args.seed, "processes": {}}

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"{len(sets)} stored sets in turns ({', '.join(f'{len(v)} at {k} processes' for k, v in sorted(by_ranks.items()))})")
    for ranks, among in sorted(by_ranks.items()):
        total, noise = within_error(among)
        own = float(np.sqrt(max(0.0, total ** 2 - noise ** 2)))
        entry = record["processes"][str(ranks)] = {"sets": len(among), "within_error": total, "noise_part": noise,
                                                   "own_error": own, "rules": [], "smaller_error": [], "pairs": []}
        say(f"\n{ranks} processes, {len(among)} sets: the model's within-set error {100 * total:.2f}% (sd of log), "
            f"the noise's part {100 * noise:.2f}%, its own about {100 * own:.2f}%")
        for drift_free in (False, True):
            rule = "drift-free A/A noise" if drift_free else "A/A noise"
            for margin in args.margins:
                right, decided = model_share(among, margin, drift_free)
                say(f"  a lead of {margin:g} {rule}: the model right in {right} of {decided} decided sets "
                    f"({100 * right / max(decided, 1):.0f}%)")
                for scale, shrink in itertools.product(args.noise_scale, (False, True)):
                    n_decided, perfect, estimated = simulate_sets(among, args.draws, scale, shrink, own, rng, margin,
                                                                  drift_free)
                    entry["rules"].append({"drift_free": drift_free, "margin": margin, "model_right": right,
                                           "model_decided": decided, "noise_scale": scale, "shrunk": shrink,
                                           "decided_per_draw": n_decided, "perfect": perfect, "own_error": estimated})
                    say(f"    noise x{scale:g}, true steps {'shrunk' if shrink else 'as measured'}: "
                        f"{n_decided:.1f} of {len(among)} sets decided per draw; right share of decided: a perfect "
                        f"predictor {100 * perfect:.1f}%, one with the model's own error {100 * estimated:.1f}%")
        for scale in args.noise_scale:  # what a predictor of a smaller within-set error would score (the test's rule)
            shares = []
            for error in args.model_errors:
                share = simulate_sets(among, args.draws, scale, True, error, rng)[2]
                entry["smaller_error"].append({"noise_scale": scale, "error": error, "right": share})
                shares.append(f"{100 * error:.1f}% -> {100 * share:.1f}%")
            say(f"  noise x{scale:g}, true steps shrunk, a lead of 1 A/A noise: a predictor of within-set error "
                + ", ".join(shares))
        say("  pairs of plans of one set, by their predicted gap: measured in the predicted order")
        for low, high, pairs, share in pair_agreement(among):
            entry["pairs"].append({"low": low, "high": None if np.isinf(high) else high, "pairs": pairs,
                                   "in_order": share})
            say(f"    {100 * low:.0f}-{100 * high:.0f}% apart: {pairs} pairs, {100 * share:.0f}%")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "output.txt").write_text("\n".join(lines) + "\n")
    (args.out / "ceiling.json").write_text(json.dumps(record, indent=1) + "\n")
    write_source(args.out)


if __name__ == "__main__":
    main()
