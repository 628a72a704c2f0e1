"""Is a device's figure a property of the device set, or of the kernel instance that timed it?

experiments/results/refine_trace: copies of the same device set, timed in one interleaved run,
came out up to 14% apart (criteo-terabyte, 8 devices, Intel Xeon). Two readings: noise that
more passes would average away (then the copies' spread is about what the pass-to-pass
scatter predicts: sd of a median of P passes ~ 1.25 sd / sqrt(P)), or something fixed for
the life of a kernel instance (where its buffers landed in memory, say): then each copy's
passes agree with each other and copies disagree beyond that.

This times every device of a plan file ``COPIES`` times (independent kernel instances of the
same shards and lookups) in one run of ``measure``'s protocol with ``PASSES`` passes and
prints, per device set, each copy's figure, the copies' spread and the spread the pass
scatter alone predicts.

    python experiments/copy_noise.py experiments/results/refine_trace/refined.json \
        --family criteo-terabyte --devices 8 --task 1 --seed 139 [--copies 3 --passes 9]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from neuroshard.costmodels.measure.timing import time_devices
from neuroshard.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from refine_trace import add_task_arguments, benchmark_task  # the task's options, in one place


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan")
    add_task_arguments(parser)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--only", type=int, nargs="*", default=None, help="these devices of the plan only")
    parser.add_argument("--apart", action="store_true",
                        help="a device's copies as far apart in the run as the plan's devices allow (copy k of "
                             "device set i at k * sets + i, as two copies of a plan are in measure); default: "
                             "side by side (i * copies + k)")
    args = parser.parse_args()
    tables, _ = benchmark_task(args)
    plan = Plan.read(args.plan)
    which = args.only if args.only is not None else list(range(plan.num_devices))
    sets = [plan.shards_on(d) for d in which]
    n, c = len(sets), args.copies
    position = (lambda i, k: k * n + i) if args.apart else (lambda i, k: i * c + k)
    devices = [None] * (n * c)
    for i in range(n):
        for k in range(c):
            devices[position(i, k)] = sets[i]
    passes, config = time_devices(devices, tables, passes=args.passes, progress=True)
    print(f"{config['hardware']}: {len(sets)} device sets x {args.copies} copies "
          f"({'apart' if args.apart else 'side by side'}), {args.passes} passes, figure "
          f"{config['figure']}, {config['seconds']} s")
    rows = []
    for i, d in enumerate(which):
        copies = [np.asarray(passes[position(i, k)]) for k in range(args.copies)]
        medians = np.array([np.median(c) for c in copies])
        scatter = np.mean([np.std(c, ddof=1) / np.mean(c) for c in copies])  # pass-to-pass, relative
        predicted = 1.2533 * scatter / math.sqrt(args.passes)  # sd of a median of P normal draws, relative
        observed = np.std(medians, ddof=1) / np.mean(medians)
        rows.append((predicted, observed))
        print(f"device {d}: copies {' '.join(f'{m:7.2f}' for m in medians)} ms  spread (max/min) "
              f"{medians.max() / medians.min():.3f}  copies' sd {100 * observed:4.1f}%  predicted from the passes "
              f"{100 * predicted:4.1f}%  pass scatter {100 * scatter:4.1f}%")
    predicted, observed = np.array(rows).T
    print(f"mean over device sets: copies' sd {100 * observed.mean():.1f}%, predicted from the pass scatter "
          f"{100 * predicted.mean():.1f}% (ratio {observed.mean() / predicted.mean():.2f})")


if __name__ == "__main__":
    main()
