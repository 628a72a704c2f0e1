"""Training speed of the NeuroShard runtime on a 26-table criteo-like model, on 2 and 4
CPU processes (gloo), beside TorchRec's DistributedModelParallel on the same placement
where TorchRec is installed.

    python experiments/runtime_benchmark.py [--out out/runtime_benchmark] [--iterations 20]

Writes the tables file it makes (criteo Kaggle cardinalities, capped so the whole model
fits in a few hundred MB) and a results CSV to --out, and prints a small table.
Iterations/s is 1 / the slowest device's median step (forward, all-to-all, dense,
backward, SGD); input sampling is excluded on both sides.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from neuroshard.launch import launch, step_progress
from neuroshard.plan import Plan, Shard
from neuroshard.runtime.evaluate import evaluate
from neuroshard.tables import Table, TableSet

log = logging.getLogger("runtime_benchmark")

#: criteo Kaggle (Display Advertising Challenge) categorical cardinalities
CRITEO_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
               27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def criteo_like_tables(max_rows: int = 400_000, dim: int = 32, batch_size: int = 2048) -> TableSet:
    """26 one-hot tables with criteo's cardinalities capped at ``max_rows``, zipf-skewed access."""
    tables = [Table(f"t{i}", min(n, max_rows), dim, 1.0, {"zipf_alpha": 1.05} if n > 1000 else {})
              for i, n in enumerate(CRITEO_ROWS)]
    return TableSet("criteo-like-26-scaled", tables, batch_size)


def make_plan(tables: TableSet, devices: int, kind: str) -> Plan:
    """Table-wise: biggest tables first onto the emptiest device. Column-wise: every
    table cut into ``devices`` column slices, slice i on device i."""
    shards = []
    if kind == "table_wise":
        load = [0] * devices
        for t in sorted(tables, key=lambda t: -t.size_bytes()):
            d = load.index(min(load))
            load[d] += t.size_bytes()
            shards.append(Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, d))
    else:
        for t in tables:
            w = t.embedding_dim // devices
            shards += [Shard(t.name, 0, t.num_embeddings, i * w, w, i) for i in range(devices)]
    return Plan(list(tables), shards, devices, 2**40, tables_name=tables.name,
                provenance={"algorithm": f"benchmark-{kind}"}).validate()


# ------------------------------------------------------------------ TorchRec
def torchrec_worker(wctx, plan: Plan, tables: list[Table], batch_size: int, steps: int, warmup: int,
                    lr: float, timeout_s: float) -> float:
    """One TorchRec process: the same DLRM, embeddings in an EmbeddingBagCollection sharded by
    DistributedModelParallel with the plan's placement; returns its median step in ms."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from neuroshard.dense import build_dense
    from neuroshard.runtime.model import local_slice, loss_sum, make_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                                  feature_names=[t.name]) for t in tables]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": lr})

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sparse = ebc
            self.dense = build_dense(tables, seed=0)

        def forward(self, dense_x, kjt):
            return self.dense(dense_x, self.sparse(kjt).values())

    per_table = {}
    for t in tables:
        shards = plan.shards_of(t.name)
        per_table[t.name] = (table_wise(rank=shards[0].device) if len(shards) == 1 else
                             column_wise(ranks=[s.device for s in sorted(shards, key=lambda s: s.col_offset)]))
    module_plan = construct_module_sharding_plan(ebc, per_table, local_size=world, world_size=world, device_type="cpu")
    model = DistributedModelParallel(Model(), env=ShardingEnv.from_process_group(dist.group.WORLD),
                                     device=torch.device("cpu"), plan=ShardingPlan({"sparse": module_plan}),
                                     sharders=[EmbeddingBagCollectionSharder()])
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                      lambda params: torch.optim.SGD(params, lr=lr))
    start, end = local_slice(batch_size, world, rank)
    batches = []
    for step in range(4):  # a few distinct batches, cycled: sampling is not timed
        b = make_batch(tables, batch_size, step, seed=0)
        values, lengths = [], []
        for t in tables:
            rows, lens = b.lookups[t.name]
            offsets = np.concatenate([[0], np.cumsum(lens)])
            values.append(rows[offsets[start]:offsets[end]])
            lengths.append(lens[start:end])
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[t.name for t in tables],
                                                  values=torch.from_numpy(np.concatenate(values)),
                                                  lengths=torch.from_numpy(np.concatenate(lengths)))
        batches.append((b.dense[start:end], b.labels[start:end], kjt))
    times = []
    for step in range(steps):
        wctx.heartbeat(step_progress(step))
        dense_x, labels, kjt = batches[step % len(batches)]
        t0 = time.perf_counter()
        loss = loss_sum(model(dense_x, kjt), labels, batch_size)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        times.append(1e3 * (time.perf_counter() - t0))
    dist.destroy_process_group()
    return statistics.median(times[warmup:])


def run_torchrec(plan: Plan, tables: TableSet, batch_size: int, iterations: int, warmup: int) -> float:
    """Iterations/s of TorchRec DMP on ``plan``'s placement (slowest rank's median step)."""
    out = launch(torchrec_worker, (plan, list(tables), batch_size, iterations + warmup, warmup, 0.1, 300.0),
                 plan.num_devices, timeout_s=300.0)
    return 1e3 / max(out.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/runtime_benchmark")
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--no-torchrec", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables = criteo_like_tables(batch_size=args.batch_size)
    tables.write(out / "criteo_like_26_scaled.json")
    print(f"{len(tables)} tables, {tables.total_bytes() / 2**20:.0f} MiB, batch {args.batch_size}, "
          f"{args.iterations} iterations after {args.warmup} warm-up")

    rows = []
    torchrec_ok = not args.no_torchrec
    for devices in args.devices:
        for kind in ("table_wise", "column_wise"):
            plan = make_plan(tables, devices, kind)
            m = evaluate(plan, tables, devices, iterations=args.iterations, warmup=args.warmup,
                         batch_size=args.batch_size, timeout_s=300.0)
            rows.append({"runtime": "neuroshard", "devices": devices, "plan": kind,
                         "iterations_per_s": round(m.iterations_per_s, 2),
                         "max_device_embedding_ms": round(m.max_device_cost_ms, 2)})
            print(rows[-1], flush=True)
            if torchrec_ok:
                try:
                    ips = run_torchrec(plan, tables, args.batch_size, args.iterations, args.warmup)
                    rows.append({"runtime": "torchrec DMP", "devices": devices, "plan": kind,
                                 "iterations_per_s": round(ips, 2), "max_device_embedding_ms": float("nan")})
                    print(rows[-1], flush=True)
                except Exception as exc:  # report why and go on without TorchRec
                    log.debug("%s", traceback.format_exc())
                    print(f"torchrec comparison skipped: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                    torchrec_ok = False
    import pandas as pd
    df = pd.DataFrame(rows)
    df.to_csv(out / "results.csv", index=False)
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
