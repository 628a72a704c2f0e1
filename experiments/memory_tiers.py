"""What memory tiers save: the fewest devices with every row in device memory against the fewest
whose tiered plan (rows in host memory or on SSD behind device caches) is estimated within
``--slowdown`` of it, per preset and device speed (``neuroshard capacity``; nothing is timed).

    python experiments/memory_tiers.py                                   # two presets x two speeds
    python experiments/memory_tiers.py --presets criteo-terabyte --speeds 100

Per preset (``neuroshard tables generate --preset P``, seed 0) and relative speed X (every
device X times the hardware the cost models measured: 100 stands in for GPUs planned with the
shipped CPU model, an assumption), ``search.capacity.plan_capacity`` as ``neuroshard capacity P.json
-m 8GiB --local-world-size 4 --host-memory 512GiB --ssd 4TiB --relative-speed X`` runs it. Tier
costs are analytic (``costmodels.tiers``: host link 32 GB/s, SSD 6 GB/s and 1M reads/s, or the
flags). Written to ``--out`` (default ``experiments/results/memory_tiers``): ``capacity.csv``
(one row per preset and speed: devices and estimated ms each way, the tables outside device
memory, and every host count tried) and ``SOURCE.json``.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
from common import RESULTS, write_source

from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.families import generate
from neuroshard.search.capacity import describe, plan_capacity

PRESETS = ("dlrm-2021", "criteo-terabyte")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--speeds", nargs="+", type=float, default=[1.0, 100.0], help="relative device speeds")
    parser.add_argument("--memory", default="8GiB", help="device memory for embeddings (default 8GiB)")
    parser.add_argument("--local-world-size", type=int, default=4)
    parser.add_argument("--host-memory", default="512GiB")
    parser.add_argument("--ssd", default="4TiB")
    parser.add_argument("--slowdown", type=float, default=1.10)
    parser.add_argument("--out", type=Path, default=RESULTS / "memory_tiers")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_source(args.out)
    models = load_cost_models()
    rows = []
    for preset in args.presets:
        tables = generate(preset, seed=0)
        for speed in args.speeds:
            start = time.perf_counter()
            report = plan_capacity(tables, args.memory, args.local_world_size, host_memory=args.host_memory,
                                   ssd=args.ssd, slowdown=args.slowdown, cost_models=models, relative_speed=speed)
            flat, tiered = report.device_memory_only, report.tiered
            tried = "; ".join(f"{t['devices']}: {t['cost_ms']:.5g}" for t in report.tried if t["tiered"] and t["fits"])
            rows.append({"preset": preset, "tables": len(tables), "table_gib": round(tables.total_bytes() / 2**30, 1),
                         "relative_speed": speed, "device_only_devices": flat["devices"],
                         "device_only_ms": flat["cost_ms"], "tiered_devices": tiered["devices"],
                         "tiered_ms": tiered["cost_ms"], "tiered_tables": tiered["tiered_tables"],
                         "tiered_plans_tried": tried, "seconds": round(time.perf_counter() - start, 1)})
            print(f"{preset} x{speed:g}:\n{describe(report)}", flush=True)
    pd.DataFrame(rows).to_csv(args.out / "capacity.csv", index=False)
    print(f"wrote {args.out / 'capacity.csv'}")


if __name__ == "__main__":
    main()
