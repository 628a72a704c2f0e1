"""A complete TorchRec training script that plans with NeuroShard instead of TorchRec's planner.

    python examples/torchrec_planner.py                          # 2 gloo processes on this CPU
    torchrun --nproc_per_node 2 examples/torchrec_planner.py     # the same, started by torchrun
    torchrun --nproc_per_node 8 examples/torchrec_planner.py --backend nccl --device cuda   # 8 GPUs

The model, sharders, process group and DistributedModelParallel are TorchRec's, as in any
TorchRec script; the one change is the planner::

    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, constraints=constraints)
    # becomes
    planner = NeuroShardPlanner(topology=topology, batch_size=batch_size, constraints=constraints)
    plan = planner.collective_plan(model, sharders, pg)   # rank 0 plans, every rank gets the plan

``planner.last_comparison`` is TorchRec's own planner on the same task, its plan scored by
the same cost models as ours (an estimate, not a measurement); ``planner.last_plan`` is our
plan file (``last_plan.write("plan.json")``, then ``neuroshard plan show plan.json``). With
``logging.basicConfig(level=logging.INFO)`` the planner also logs per rank what it planned.
The shipped cost models were measured on a CPU: on GPUs, pass ``calibrate=200`` to the
planner (the tables timed on this machine first) or cost models pre-trained there.
"""
from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from neuroshard.torchrec import NeuroShardPlanner

#: the model's embedding tables: name, rows, width, lookups per sample
TABLES = [("user_id", 200_000, 64, 1), ("item_id", 100_000, 64, 1), ("item_history", 100_000, 64, 20),
          ("query_terms", 50_000, 32, 8), ("category", 1_000, 16, 3), ("country", 250, 16, 1),
          ("device_type", 50, 8, 1), ("hour", 24, 8, 1)]


class RecModel(nn.Module):
    """Embedding bags pooled per feature, concatenated, then an MLP to one logit."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        configs = [EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[name])
                   for name, rows, dim, _ in TABLES]
        # on the meta device: DistributedModelParallel allocates each rank's shards only
        self.sparse = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        width = sum(dim for _, _, dim, _ in TABLES)
        self.over = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.over(self.sparse(features).values()).squeeze(1)


def random_batch(batch_size: int, device: torch.device, generator: torch.Generator):
    """One rank's batch: every feature's ids (about its lookups per sample) and 0/1 labels."""
    lengths = torch.cat([torch.poisson(torch.full((batch_size,), float(lookups)), generator=generator).long()
                         for _, _, _, lookups in TABLES])
    per_feature = lengths.view(len(TABLES), batch_size).sum(1).tolist()
    ids = torch.cat([torch.randint(rows, (n,), generator=generator) for (_, rows, _, _), n in zip(TABLES, per_feature)])
    features = KeyedJaggedTensor.from_lengths_sync([name for name, *_ in TABLES], ids, lengths)
    labels = torch.randint(2, (batch_size,), generator=generator).float()
    return features.to(device), labels.to(device)


def train(rank: int, world_size: int, local_world_size: int, args: argparse.Namespace) -> None:
    if args.device == "cuda":
        device = torch.device(f"cuda:{rank % local_world_size}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))  # the ranks share the cores
    dist.init_process_group(args.backend, rank=rank, world_size=world_size)
    pg = dist.group.WORLD

    model = RecModel(device)
    # the tables' optimizer runs inside their backward (TorchRec's fused optimizer)
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse.parameters(), {"lr": args.lr})
    sharders = [EmbeddingBagCollectionSharder()]
    # memory per rank for the tables: each GPU's own (HBM) on cuda, the host's (DDR) on cpu
    memory = ({"hbm_cap": torch.cuda.get_device_properties(device).total_memory} if args.device == "cuda"
              else {"ddr_cap": 8 * 2**30})
    # (TorchRec 1.8 logs that it prefers TopologyFactory.create_topology(); either gives the planner a Topology)
    topology = Topology(world_size=world_size, local_world_size=local_world_size, compute_device=args.device,
                        **memory)
    # what TorchRec's planner reads from constraints, ours does: here the lookups per sample
    constraints = {name: ParameterConstraints(pooling_factors=[float(lookups)]) for name, _, _, lookups in TABLES}

    # The swap: NeuroShardPlanner where the script had EmbeddingShardingPlanner.
    planner = NeuroShardPlanner(topology=topology, batch_size=args.batch_size, constraints=constraints)
    plan = planner.collective_plan(model, sharders, pg)

    model = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), device=device, plan=plan,
                                     sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.SGD(params, lr=args.lr))
    optimizer = CombinedOptimizer([model.fused_optimizer, dense])
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        path = planner.last_plan.write(args.out / "plan.json")  # `neuroshard plan show` reads it
        print(f"{planner.last_plan.format_summary()}\nwrote {path}")
        for name, sharding in plan.plan["sparse"].items():
            print(f"  {name:<13} {sharding.sharding_type:<12} ranks {sharding.ranks}  kernel {sharding.compute_kernel}")
        print(planner.last_comparison.format())

    generator = torch.Generator().manual_seed(rank)
    loss_fn = nn.BCEWithLogitsLoss()
    for step in range(args.steps):
        features, labels = random_batch(args.batch_size, device, generator)
        loss = loss_fn(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f} (rank 0)")
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"trained {args.steps} steps on {world_size} ranks with NeuroShard's plan")


def spawned(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    """One process of ``mp.spawn``: the environment torchrun would have set."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world_size))
    train(rank, world_size, world_size, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes to spawn without torchrun (default: 2 on cpu, every GPU on cuda)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=Path("out/examples/torchrec_planner"),
                        help="folder for our plan file")
    args = parser.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: one rank of it
        world_size = int(os.environ["WORLD_SIZE"])
        train(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), args)
        return
    world_size = args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 2)
    with socket.socket() as s:  # a free port for the process group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(spawned, args=(world_size, port, args), nprocs=world_size)


if __name__ == "__main__":
    main()
