"""How the cluster, the optimizer and the communication precision change a plan.

    python experiments/topology_example.py                 # about 2-3 minutes on 2 cores
    python experiments/topology_example.py --no-measure    # the searches only

One task (dlrm-2021 tables, 8 devices) is searched with NeuroShard for every combination
of: topology 1 host x 8 or 2 hosts x 4 (``--local-world-size``, TorchRec's GPU figures:
600 GB/s within a host, 12.5 GB/s per GPU across hosts), optimizer sgd or adam (adam's
two state tensors count in memory; the memory is sized so adam is tight) and
communication precision fp32 or fp16. The shipped cost models were measured on a CPU,
whose compute is ~100x a GPU's, so with GPU links the exchange is a small share of the
estimate; the same 8 searches are repeated with the links 100x slower (``--link-scale``)
so communication weighs what it would against GPU compute. A plan searched without a
topology (the measured one-host network) is the reference.

Printed per plan: its estimate (slowest device, its compute and exchange, the
inter-host share), the shard kinds TorchRec would run (from the export), and how many
tables sit elsewhere than in the reference plan. Then every distinct plan's device
compute is measured on this machine (``measure_plans``: devices timed one at a time,
interleaved): what this machine can measure; communication across hosts it cannot.
Written to ``--out``: ``plans.csv``, ``summary.md``, the plan files and ``measured.json``.
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import pandas as pd
from common import write_source

import neuroshard
from neuroshard.constants import DEFAULT_INTER_HOST_GBPS, DEFAULT_INTRA_HOST_GBPS
from neuroshard.costmodels import load_cost_models
from neuroshard.datasets.synthetic import generate
from neuroshard.optimizers import shard_bytes
from neuroshard.plan import Plan
from neuroshard.torchrec.export import torchrec_sharding

HOSTS = {"1 host x 8": 8, "2 hosts x 4": 4}
OPTIMIZERS = ("sgd", "adam")
COMM = ("fp32", "fp16")


def placement(plan: Plan) -> dict[str, tuple]:
    """Per table, its shards' (rows, columns, device): what "the same plan" means here."""
    return {t.name: tuple(sorted((s.row_offset, s.num_rows, s.col_offset, s.num_cols, s.device)
                                 for s in plan.shards_of(t.name))) for t in plan.tables}


def markdown(table: pd.DataFrame) -> str:
    """A pipe table (pandas' ``to_markdown`` needs tabulate)."""
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def describe(name: str, plan: Plan, reference: Plan) -> dict:
    est = plan.estimate
    slow = max(range(plan.num_devices), key=lambda d: est["per_device_cost_ms"][d])
    comm = est["per_device_fwd_comm_ms"][slow] + est["per_device_bwd_comm_ms"][slow] + est["per_device_reduce_ms"][slow]
    kinds: dict[str, int] = {}
    for record in torchrec_sharding(plan, compute_device="cpu")["tables"].values():
        kinds[record["sharding_type"]] = kinds.get(record["sharding_type"], 0) + 1
    mine, theirs = placement(plan), placement(reference)
    used = plan.memory_used_bytes()
    return {"plan": name, "max_ms": round(est["max_device_cost_ms"], 2),
            "compute_ms": round(est["per_device_compute_ms"][slow], 2), "comm_ms": round(comm, 3),
            "inter_host_ms": round(est.get("per_device_inter_host_comm_ms", [0.0] * plan.num_devices)[slow], 3),
            "shards": len(plan.shards),
            "kinds": ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
            "tables_moved": sum(mine[t] != theirs[t] for t in mine),
            "max_memory_%": round(100 * max(used) / plan.device_memory_bytes, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=32, help="dlrm-2021 tables in the task (default: 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--link-scale", type=float, default=0.01,
                        help="the second set of searches has links this times TorchRec's (default: 0.01)")
    parser.add_argument("--passes", type=int, default=3, help="timed passes (default: 3)")
    parser.add_argument("--no-measure", action="store_true", help="search only")
    parser.add_argument("--out", default="experiments/results/topology")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    write_source(out)

    tables = generate("dlrm-2021", num_tables=args.tables, seed=args.seed)
    models = load_cost_models()
    adam_bytes = sum(shard_bytes(t.num_embeddings, t.embedding_dim, 4, "adam") for t in tables)
    memory = int(adam_bytes / 8 * 1.3)  # adam (3x the weights) fills 77% of the devices, sgd 26%
    print(f"task: {len(tables)} dlrm-2021 tables (seed {args.seed}), batch {tables.batch_size}, 8 devices of "
          f"{memory / 2**30:.2f} GiB; weights {tables.total_bytes(4) / 2**30:.2f} GiB, with adam state "
          f"{adam_bytes / 2**30:.2f} GiB; cost models '{models.name}'")

    plans: dict[str, Plan] = {}
    reference_of: dict[str, str] = {}  # plan -> the same topology's sgd/fp32 plan
    start = time.perf_counter()
    plans["no topology, sgd, fp32"] = neuroshard.shard(tables, 8, memory, cost_models=models)
    reference_of["no topology, sgd, fp32"] = "no topology, sgd, fp32"
    for scale, (hosts, local), optimizer, comm in itertools.product((1.0, args.link_scale), HOSTS.items(),
                                                                    OPTIMIZERS, COMM):
        cluster = hosts if scale == 1.0 else f"{hosts}, links x{scale:g}"
        topology = {"local_world_size": local, "intra_host_gbps": DEFAULT_INTRA_HOST_GBPS * scale,
                    "inter_host_gbps": DEFAULT_INTER_HOST_GBPS * scale}
        name = f"{cluster}, {optimizer}, {comm}"
        plans[name] = neuroshard.shard(tables, 8, memory, cost_models=models, topology=topology,
                                       optimizer=optimizer, comm_precision=comm)
        reference_of[name] = f"{cluster}, sgd, fp32"
    print(f"{len(plans)} searches in {time.perf_counter() - start:.0f} s")

    rows = []
    for i, (name, plan) in enumerate(plans.items()):
        rows.append(describe(name, plan, plans[reference_of[name]]))
        plan.write(out / "plans" / f"plan{i:02d}.json")
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    print("\n'tables_moved': tables laid out differently from the same topology's sgd/fp32 plan; plan files "
          "plans/planNN.json in row order\n")
    print(table.to_string(index=False))
    table.to_csv(out / "plans.csv", index=False)

    measured_md = ""
    if not args.no_measure:
        from neuroshard.runtime.measure_plan import measure_plans
        chosen: dict[str, Plan] = {}  # plans with the same shards on the same devices are timed once
        seen: set[str] = set()
        for name, plan in plans.items():
            key = repr(sorted(placement(plan).items()))
            if key not in seen:
                seen.add(key)
                chosen[name] = plan
        print(f"\nmeasuring the device compute of {len(chosen)} distinct plans on this machine "
              f"({args.passes} passes, devices one at a time) ...")
        start = time.perf_counter()
        result = measure_plans(chosen, tables, cost_models=models, passes=args.passes)
        print(result.format())
        print(f"measured in {time.perf_counter() - start:.0f} s")
        result.write_json(out / "measured.json")
        measured = pd.DataFrame([{"plan": m.name, "measured max compute ms": round(m.max_compute_ms, 2),
                                  "estimated max compute ms": round(max(m.estimated_compute_ms), 2),
                                  "balance (max/mean)": round(m.balance, 3)} for m in result.plans])
        print(measured.to_string(index=False))
        measured_md = (f"\n\n## Device compute measured on this machine (batch {result.config['batch_size']}, "
                       f"{args.passes} passes; communication is not measured)\n\n" + markdown(measured))
    (out / "summary.md").write_text(
        f"# Topology, optimizer and communication precision on one task\n\n`python experiments/topology_example.py`"
        f" ({len(tables)} dlrm-2021 tables, 8 devices of {memory / 2**30:.2f} GiB, batch {tables.batch_size})\n\n"
        + markdown(table) + measured_md + "\n")
    print(f"wrote {out}/plans.csv, summary.md, plans/")


if __name__ == "__main__":
    main()
