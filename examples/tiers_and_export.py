"""Tables bigger than your devices' memory: count devices, plan with host memory, export to TorchRec.

    python examples/tiers_and_export.py
    python examples/tiers_and_export.py --memory 16GiB --host-memory 512GiB --devices 8

12 tables of 5-15 million rows x 128 (57 GiB in fp32) and devices of 8 GiB. The search may
keep a table's rows in host memory behind a device cache it sizes from the table's
locality (its Zipf exponent here); such a table exports to TorchRec as
``fused_uvm_caching`` with its cache's share of rows as ``load_factor`` (``fused_uvm``
without a cache; a table on SSD, ``search --ssd``, as ``key_value``). The same on the
command line::

    neuroshard capacity tables.json -m 8GiB --local-world-size 4 --host-memory 256GiB --slowdown 1.5 -o capacity.json
    neuroshard search tables.json -d 4 -m 8GiB --host-memory 256GiB -o plan.json
    neuroshard export plan.json --format torchrec --compute-device cuda -o plan.torchrec.json

No hardware is timed: the costs are the shipped cost models' estimates (a 2-core CPU's),
the host link's traffic modelled from its bandwidth (32 GB/s per device by default).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import neuroshard
from neuroshard.exporters import get_exporter
from neuroshard.search.capacity import describe, plan_capacity
from neuroshard.topology import make_topology


def model_tables(num_tables: int) -> neuroshard.TableSet:
    """Tables of 5, 10 and 15 million rows, 128 wide, 2-5 lookups per sample, Zipf 0.8-1.2."""
    tables = [neuroshard.Table(f"t{i}", 5_000_000 * (1 + i % 3), 128, 2.0 + i % 4, {"zipf_alpha": 0.8 + 0.1 * (i % 5)})
              for i in range(num_tables)]
    return neuroshard.TableSet("big-model", tables, batch_size=16384)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tables", type=int, default=12)
    parser.add_argument("--devices", type=int, default=4, help="devices of the tiered plan (one host)")
    parser.add_argument("--memory", default="8GiB", help="memory per device for the tables")
    parser.add_argument("--host-memory", default="256GiB", help="host memory per host for the tables")
    parser.add_argument("--slowdown", type=float, default=1.5,
                        help="capacity: how much slower a tiered plan may be than all in device memory")
    parser.add_argument("--out", type=Path, default=Path("out/examples/tiers_and_export"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tables = model_tables(args.num_tables)
    tables.write(args.out / "tables.json")
    print(f"{len(tables)} tables, {tables.total_bytes() / 2**30:.1f} GiB in fp32; devices of {args.memory}")

    # 1. How many devices: all rows in device memory, against rows in host memory behind caches
    #    (whole hosts of 4 devices; the tiered plan may be estimated at most --slowdown slower).
    report = plan_capacity(tables, args.memory, local_world_size=4, host_memory=args.host_memory,
                           slowdown=args.slowdown)
    print(f"\n== capacity\n{describe(report)}")

    # 2. A plan for the devices you have: the host memory each host gives the tables.
    topology = make_topology(args.devices, host_memory_bytes=args.host_memory)
    plan = neuroshard.shard(tables, devices=args.devices, memory=args.memory, topology=topology)
    plan.write(args.out / "plan.json")
    print(f"\n== search on {args.devices} devices\n{plan.format_summary()}")

    # 3. Export for TorchRec: one ParameterSharding record per table, with its compute kernel.
    exported = get_exporter("torchrec").export(plan, compute_device="cuda")
    path = args.out / "plan.torchrec.json"
    path.write_text(json.dumps(exported, indent=1) + "\n")
    print(f"\n== export ({path}): each table's TorchRec compute kernel")
    for name, record in exported["tables"].items():
        cache = record.get("cache_params", {})
        extra = f", cache load_factor {cache['load_factor']:g} ({cache['algorithm']})" if cache else ""
        kind, ranks, kernel = record["sharding_type"], record["ranks"], record["compute_kernel"]
        print(f"  {name:<4} {kind:<12} on ranks {ranks}: {kernel}{extra}")


if __name__ == "__main__":
    main()
