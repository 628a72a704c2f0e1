"""Plan your own tables: a tables file in, a sharding plan out.

    python examples/plan_your_tables.py                       # 40 generated tables, 8 devices of 4 GiB
    python examples/plan_your_tables.py --tables tables.json --devices 4 --memory 16GiB

Without ``--tables`` it first writes a tables file of synthetic tables (the ``dlrm-2021``
preset, calibrated to Meta's published DLRM access statistics). To plan your own model,
write one entry per embedding table (docs/formats.md)::

    {"format": "neuroshard.tables/v1", "name": "my-model", "batch_size": 16384,
     "tables": [{"name": "user_id", "num_embeddings": 20000000, "embedding_dim": 128,
                 "pooling_factor": 1.0, "access": {"zipf_alpha": 1.05}}, ...]}

``batch_size`` is the global batch (per-rank batch x ranks). The same steps on the command
line::

    neuroshard tables generate --preset dlrm-2021 --num-tables 40 -o tables.json
    neuroshard search tables.json -d 8 -m 4GiB -o plan.json
    neuroshard plan show plan.json

The estimate comes from the shipped cost models, measured on a 2-core CPU: calibrate on
your machine (``calibrate=200``, ``search --calibrate``) before trusting its milliseconds.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import neuroshard
from neuroshard.datasets.families import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, help="your tables file (default: generate one)")
    parser.add_argument("--preset", default="dlrm-2021", help="preset to generate without --tables")
    parser.add_argument("--num-tables", type=int, default=40, help="tables to generate without --tables")
    parser.add_argument("--devices", type=int, default=8, help="devices (GPUs) to shard over")
    parser.add_argument("--memory", default="4GiB", help="memory per device for the tables, e.g. 16GiB")
    parser.add_argument("--out", type=Path, default=Path("out/examples/plan_your_tables"),
                        help="folder for the tables file and the plan")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    # 1. The tables: yours, or synthetic ones written as a tables file you can edit.
    if args.tables is None:
        args.tables = generate(args.preset, num_tables=args.num_tables, seed=0).write(args.out / "tables.json")
        print(f"wrote {args.tables}: {args.num_tables} synthetic {args.preset} tables")
    tables = neuroshard.TableSet.read(args.tables)

    # 2. Search a plan: which device holds which table, or which rows / columns of it.
    plan = neuroshard.shard(tables, devices=args.devices, memory=args.memory)

    # 3. Read it: per device its memory, shards and estimated cost, then where each table went.
    print(plan.format_summary())
    estimate = plan.estimate
    print(f"\nslowest device: {estimate['max_device_cost_ms']:.3f} ms per iteration at a global batch of "
          f"{estimate['batch_size']:,}")

    # 4. Write it: the plan file `neuroshard plan show`, `export` and `train` read.
    path = plan.write(args.out / "plan.json")
    print(f"wrote {path}; next: neuroshard plan show {path}")


if __name__ == "__main__":
    main()
