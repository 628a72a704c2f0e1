"""How much do two copies of the same plan differ in one interleaved timing run, per statistic?

    python experiments/timing_noise.py --family dlrm-2021 --devices 8 --copies 4 --passes 10
    python experiments/timing_noise.py --family criteo-kaggle --devices 16 --copies 4 --passes 5 --repeats 1

A task of ``--family`` (``datasets.families.family_tasks``, 8-12 tables per device, seed 31)
is planned with size-lookup (one host); its devices are timed ``--copies`` times in ONE
run of ``costmodels.measure.timing.time_devices`` (the timer of ``neuroshard measure``,
calibration and refine), ``--passes`` passes of ``--repeats`` runs each. Every pair of
copies is an A/A control. For the first 3, 5 and all passes, and for each way of turning
a device's passes into its figure (median, fastest, lower quartile), it prints the mean
per-device |log ratio| between copies, and the mean and worst |log ratio| of the copies'
max device (what a plan is judged by), then the mean time of each pass relative to all
(before formats revision 13 the first pass ran slow: its kernels' first timed runs, which
are now sizing runs and not counted).

This is what chose the fastest pass as a device's figure (``timing.device_time``).
"""
from __future__ import annotations

import argparse
import itertools

import numpy as np

from neuroshard.constants import TIMING_MAX_REPEATS, TIMING_MIN_PASS_MS
from neuroshard.costmodels.measure.timing import time_devices
from neuroshard.datasets.families import FAMILIES, family_tasks
from neuroshard.search.api import shard
from neuroshard.topology import Topology

STATISTICS = {
    "median": lambda x: np.median(x, -1),
    "fastest": lambda x: np.min(x, -1),
    "quartile": lambda x: np.quantile(x, 0.25, -1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="dlrm-2021", choices=sorted(FAMILIES))
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--min-pass-ms", type=float, default=TIMING_MIN_PASS_MS,
                        help="a shorter device runs more per pass, up to --max-repeats runs")
    parser.add_argument("--max-repeats", type=int, default=TIMING_MAX_REPEATS)
    parser.add_argument("--no-reference", action="store_true",
                        help="raw passes (no reference device timed before every turn, as before session 17)")
    args = parser.parse_args()
    tables, memory = family_tasks(args.family, args.devices, 1, (8, 12), seed=31)[0]
    plan = shard(tables, devices=args.devices, memory=memory, algorithm="size-lookup",
                 topology=Topology(args.devices, local_world_size=args.devices))
    sets = [plan.shards_on(d) for d in range(args.devices)]
    times, config = time_devices(sets * args.copies, tables, passes=args.passes, repeats=args.repeats,
                                 batch_size=args.batch_size, progress=True,
                                 min_pass_ms=args.min_pass_ms, max_repeats=args.max_repeats,
                                 reference=not args.no_reference)
    runs = np.array(times).reshape(args.copies, args.devices, args.passes)  # copy, device, pass
    print(f"{args.family}, {args.devices} devices, {len(tables)} tables, {args.copies} copies, {args.passes} passes "
          f"of {args.repeats}-{config['most_repeats']} runs (a pass at least {args.min_pass_ms:g} ms), "
          f"on {config['hardware']}, {config['seconds']} s, "
          f"{'raw passes' if config['figure'] == 'fastest' else 'passes relative to a reference device'}")
    print(f"{'passes':>6} {'statistic':>9} {'per-device %':>13} {'max device %':>13} {'worst %':>8}")
    for n in sorted({min(3, args.passes), min(5, args.passes), args.passes}):
        for name, stat in STATISTICS.items():
            v = stat(runs[..., :n])  # copy x device
            pairs = list(itertools.combinations(range(args.copies), 2))
            per_device = [np.abs(np.log(v[a] / v[b])).mean() for a, b in pairs]
            max_device = [abs(np.log(v[a].max() / v[b].max())) for a, b in pairs]
            print(f"{n:>6} {name:>9} {100 * np.mean(per_device):>13.2f} {100 * np.mean(max_device):>13.2f} "
                  f"{100 * np.max(max_device):>8.2f}")
    print("each pass's mean time over all:", np.round(runs.mean((0, 1)) / runs.mean(), 3).tolist())


if __name__ == "__main__":
    main()
