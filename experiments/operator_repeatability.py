"""Issue 31, item 2: how far apart are two timings of the same operator shapes on this machine?

    neuroshard collect dense -o A.json
    neuroshard collect dense -o B.json          # the same shapes again (collect's seeds are fixed)
    python experiments/operator_repeatability.py A.json B.json

Stored run (session 36): experiments/results/operator_repeatability_session36/.

The operator models' held-out GMAE (``costmodel show``) mixes the model's error with the
noise of the timings it is checked against. Two runs of ``collect dense`` time the same
shapes (the layer, optimizer and data-loading samples are drawn from fixed seeds), so the
GMAE of one run against the other is that noise: a floor under any model's held-out error
measured with one run's samples. Printed per kind and target: the samples matched, the
run-to-run GMAE (``metrics.gmae``), each run's held-out GMAE (5-fold, the shipped model
form), and the held-out GMAE of the model fitted on the two runs' geometric mean (the
noise of a mean of two runs is about 1/sqrt(2) of one's).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from neuroshard.costmodels.dense import FEATURES, FORMS, TARGETS, OperatorModels
from neuroshard.costmodels.metrics import gmae


def _samples(path: Path) -> list[dict]:
    return json.loads(path.read_text())["samples"]


def _held_out(samples: list[dict]) -> dict[str, float]:
    metrics = OperatorModels().fit(samples).metrics_
    return {key: m["held_out_gmae"] for key, m in metrics.items() if "held_out_gmae" in m}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first", type=Path, help="an operator-costs file (collect dense)")
    ap.add_argument("second", type=Path, help="another, timed later on the same machine")
    args = ap.parse_args()
    a, b = _samples(args.first), _samples(args.second)
    keyed = {(s["kind"], tuple(s["features"])): s for s in b}
    pairs = [(s, keyed[(s["kind"], tuple(s["features"]))]) for s in a
             if (s["kind"], tuple(s["features"])) in keyed]
    mean = []
    for s, t in pairs:
        m = dict(s)
        for target in ("fwd_ms", "bwd_ms", "ms"):
            if target in s and target in t:
                m[target] = float(np.sqrt(max(s[target], 1e-9) * max(t[target], 1e-9)))
        mean.append(m)
    held = {"first": _held_out(a), "second": _held_out(b), "mean of both": _held_out(mean)}
    print(f"{len(pairs)} samples of {len(a)} matched by kind and shape")
    print(f"{'kind.target':26s} {'samples':>7s} {'run-to-run':>10s} {'held-out 1st':>12s} {'2nd':>6s} "
          f"{'mean of both':>12s}")
    for kind in FEATURES:
        if FORMS[kind] == "share":
            continue
        for target in TARGETS[kind]:
            both = [(s[target], t[target]) for s, t in pairs if s["kind"] == kind]
            if not both:
                continue
            x, y = np.array(both).T
            key = f"{kind}.{target}"
            cells = ["" if held[name].get(key) is None else f"{100 * held[name][key]:.1f}%"
                     for name in ("first", "second", "mean of both")]
            print(f"{key:26s} {len(both):7d} {100 * gmae(x, y):9.1f}% {cells[0]:>12s} {cells[1]:>6s} {cells[2]:>12s}")


if __name__ == "__main__":
    main()
