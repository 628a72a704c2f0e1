"""Issue 31: does an embedding model calibrated on this machine and these tables predict the
plans of a set better, relative to each other? (Timing: calibration only; the iteration runs
are the stored ones.)

    python experiments/iteration_calibrated.py [--sets 40] [--configs N ...] [--out DIR]

For each stored set at 2 processes of session 41's runs (``HELD_OUT_RUNS``; their plans stored
with them), the pre-trained compute model is calibrated on the configuration's tables here
(``measured.calibrate.calibrated_models``: each table alone and ``--sets`` random device-sized
sets, ``neuroshard measure``'s protocol), and every stored plan predicted again with the
calibrated model's per-device embedding compute. The operator file's overheads were fitted
against the pre-trained model's level (x0.54 on this CPU), so the calibrated compute is scaled
to the pre-trained model's total over the set's plans: only the pattern across devices and
plans changes, not the embeddings' share of the step. Printed: per set and over all, GMAE,
the within-set error (sd of log(measured / predicted) about each set's mean), pairs of plans
measured in the predicted order (3% or more apart, closer), and item 6's decided sets, for the
pre-trained and the calibrated predictions. Results are kept per configuration (``--out``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import stored_plans
from iteration_relief import HELD_OUT_RUNS, scores
from iteration_stored_ranking import RESULTS, TURN_OPERATORS

from neuroshard.costmodels import resolve_cost_models
from neuroshard.costmodels.dense import load_operator_models
from neuroshard.measured.calibrate import calibrated_models
from neuroshard.search import iteration
from neuroshard.search.simulator import Simulator

SHIPPED_DURATIONS = iteration.operator_durations


def device_compute(plan, tables, models, batch: int) -> np.ndarray:
    """The compute model's per-device embedding compute of ``plan`` (ms)."""
    return np.asarray(Simulator.from_plan(plan, models, tables, batch_size=batch).evaluate_plan(plan).compute_ms[0])


def predict_set(entries, pretrained, calibrated, ops) -> list[dict]:
    """Each stored plan of one set predicted with the pre-trained and the calibrated compute."""
    config, tables = entries[0][0], entries[0][1]
    model, batch = config[3], config[4]
    base = [device_compute(plan, tables, pretrained, batch) for _, _, plan, _ in entries]
    cal = [device_compute(plan, tables, calibrated, batch) for _, _, plan, _ in entries]
    scale = sum(b.sum() for b in base) / max(sum(c.sum() for c in cal), 1e-9)
    out = []
    for (_, _, plan, row), compute in zip(entries, cal):
        def durations(*args, compute=compute, **kwargs):
            rows, sim = SHIPPED_DURATIONS(*args, **kwargs)
            share = ops.one("embedding_split", [1.0], "fwd_share")
            for rank, r in enumerate(rows):
                r["emb_fwd_ms"] = share * scale * float(compute[rank])
                r["emb_bwd_ms"] = (1.0 - share) * scale * float(compute[rank])
            return rows, sim
        shipped = iteration.estimate_iteration(plan, tables, pretrained, ops, model, batch).iteration_ms
        iteration.operator_durations = durations
        try:
            relative = iteration.estimate_iteration(plan, tables, pretrained, ops, model, batch).iteration_ms
        finally:
            iteration.operator_durations = SHIPPED_DURATIONS
        out.append({"seed": config[2], "plan": row["plan"], "shipped": shipped, "calibrated": relative,
                    "measured": row["measured_ms"], "run1": row["run1_ms"], "run2": row["run2_ms"],
                    "scale": scale})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", type=int, default=40, help="random sets per calibration (default: 40)")
    ap.add_argument("--configs", type=int, nargs="*", default=None, help="seeds to take (default: all)")
    ap.add_argument("--out", type=Path, default=RESULTS / "iteration_turns" / "calibrated")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pretrained, ops = resolve_cost_models(None), load_operator_models(TURN_OPERATORS)
    done = args.out / "sets.jsonl"
    rows = [json.loads(line) for line in done.read_text().splitlines() if line.strip()] if done.exists() else []
    seen = {r["seed"] for r in rows}
    for suite, run in HELD_OUT_RUNS:
        by_seed = defaultdict(list)
        for entry in stored_plans(suite, RESULTS / run / "configs.jsonl", pretrained):
            if entry[2].num_devices == 2:
                by_seed[entry[0][2]].append(entry)
        for seed, entries in by_seed.items():
            if seed in seen or (args.configs is not None and seed not in args.configs):
                continue
            start = time.perf_counter()
            calibrated = calibrated_models(entries[0][1], pretrained, devices=2, sets=args.sets)
            points = predict_set(entries, pretrained, calibrated, ops)
            with done.open("a") as f:
                for p in points:
                    f.write(json.dumps(p) + "\n")
            rows.extend(points)
            print(f"seed {seed}: " + ", ".join(f"{p['plan']} {p['shipped']:.1f}/{p['calibrated']:.1f}/{p['measured']:.1f}"
                                               for p in points)
                  + f" ms shipped/calibrated/measured ({time.perf_counter() - start:.0f} s)", flush=True)
    for key in ("shipped", "calibrated"):
        points = [{**r, "run": "held-out", "predicted": r[key]} for r in rows]
        s = scores(points)
        print(f"{key:10s} {len({r['seed'] for r in rows})} sets: GMAE {100 * s['gmae']:.2f}%, within-set error "
              f"{100 * s['within']:.2f}%, pairs 3%+ apart in the predicted order {100 * s['pairs_far'][0]:.1f}% of "
              f"{s['pairs_far'][1]}, closer {100 * s['pairs_near'][0]:.1f}% of {s['pairs_near'][1]}; decided sets "
              f"right / wrong / ties {s['ranking'][0]} / {s['ranking'][1]} / {s['ranking'][2]}")


if __name__ == "__main__":
    main()
