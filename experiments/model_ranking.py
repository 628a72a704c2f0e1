"""Which calibrated model ranks a task's plans as they measure? (issue 25, item 2)

One task of a family: calibrate on this machine (``neuroshard search --calibrate``'s
measurements), then time the devices of five plans (NeuroShard's with ``--row-blocks any``
against the pre-trained models, lookup, size-lookup, size, random) in one interleaved run
(3 passes each) and compare how the calibrated ensemble, the calibration's work model
(``costmodels.ensemble``), their maximum and their geometric mean predict them: held-out
GMAE on the calibration's random sets, per-device GMAE on the plans' devices (one level
fitted: the plans were timed minutes after the calibration), Spearman within each plan, and
the plans' order by predicted max device against the measured.

    python experiments/model_ranking.py --family criteo-terabyte --devices 8 --seed 169

Session 29 (AMD EPYC, family 25; experiments/results/work_model/ranking.txt): on
criteo-terabyte (seeds 169, 167) the ensemble put NeuroShard's plan first of the three close
plans, which measured the slowest; the work model ordered them as measured; on dlrm-2021
(seed 171) the ensemble ordered better.
"""
from __future__ import annotations

import argparse

import numpy as np
from scipy.stats import spearmanr

from device_composition import add_task_arguments, task_from_args
from neuroshard.costmodels.metrics import gmae
from neuroshard.measured.calibrate import start_calibration

PLANS = ["neuroshard", "lookup", "size-lookup", "size", "random"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap, seed=169)
    args = ap.parse_args()
    models, tables, _, plans = task_from_args(args, PLANS)
    calibration = start_calibration(tables, models, devices=args.devices)
    calibrated, report = calibration.fit()
    print(report.format())
    ensemble = calibrated.compute
    if getattr(ensemble, "work_model_", None) is None:
        raise SystemExit("calibration kept the pre-trained model: no work model to compare")
    devices = {name: [s for s in calibration.sim.device_sets(plan) if s] for name, plan in plans.items()}
    every = [s for name in PLANS for s in devices[name]]
    measured = calibration.time(every, 3, "timing the plans' devices")
    bounds = np.cumsum([0] + [len(devices[name]) for name in PLANS])
    features = [calibration.sim.features_of(calibration.sim.piece_ids(s)) for s in every]
    test = calibration.held_out[0]
    test_features = [calibration.features[i] for i in test]
    test_costs = np.array(calibration.costs)[test]
    predictors = {"ensemble": ensemble.predict, "work": ensemble.predict_work,
                  "max": lambda s: np.maximum(ensemble.predict(s), ensemble.predict_work(s)),
                  "geomean": lambda s: np.sqrt(ensemble.predict(s) * ensemble.predict_work(s))}
    maxima = [measured[bounds[j]:bounds[j + 1]].max() for j in range(len(PLANS))]
    print("measured max device:", ", ".join(f"{n} {m:.1f} ms" for n, m in zip(PLANS, maxima)),
          "| order:", " < ".join(PLANS[j] for j in np.argsort(maxima)))
    for tag, predict in predictors.items():
        held = gmae(predict(test_features), test_costs)
        pred = predict(features)
        level = pred.sum() / measured.sum()
        within = [spearmanr(pred[bounds[j]:bounds[j + 1]], measured[bounds[j]:bounds[j + 1]])[0]
                  for j in range(len(PLANS))]
        pmax = [pred[bounds[j]:bounds[j + 1]].max() for j in range(len(PLANS))]
        print(f"  {tag:8s} held-out GMAE {100 * held:5.1f}%  plan devices {100 * gmae(pred / level, measured):5.1f}%  "
              f"Spearman within plans {np.round(within, 2).tolist()}  order: "
              f"{' < '.join(PLANS[j] for j in np.argsort(pmax))}  (Spearman of maxima {spearmanr(pmax, maxima)[0]:.2f})")


if __name__ == "__main__":
    main()
