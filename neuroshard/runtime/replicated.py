"""Data-parallel (replicated) tables in the runtime: a full replica of each on every
rank, looked up for the rank's own slice of the batch (no all-to-all), the gradient
summed over ranks before the update.

Exactness: every rank's loss is its share of the global mean (``model.loss_sum``), so
the sum over ranks of the local gradients is the unsharded model's gradient, and the
SGD update with the summed gradient is the unsharded update. The replicas need a dense
gradient before their update (the fused TBE applies its update inside the backward,
before any all-reduce could run), so they run as fbgemm's dense table-batched kernel
(``DenseTableBatchedEmbeddingBagsCodegen``, what TorchRec runs data-parallel tables
with: one flat weights parameter, its gradient dense), or as ``F.embedding_bag`` with
the ``embedding_bag`` kernel (about 5x slower in the backward on CPU). The summed
gradient travels as one flat fp32 tensor in one ``all_reduce`` (gloo or NCCL).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..constants import DEFAULT_MAX_ROWS
from ..execution.kernels import local_lookups, resolve_kernel
from ..plan import Plan, Shard
from ..tables import Table
from .model import init_rows, local_slice


class ReplicatedTables:
    """The plan's data-parallel tables on one rank: lookup of the rank's samples, the
    all-reduce of the gradients and the SGD update (``step``)."""

    def __init__(self, plan: Plan, tables: Sequence[Table], rank: int, world_size: int, batch_size: int,
                 seed: int = 0, row_cap: int = DEFAULT_MAX_ROWS, device: torch.device | None = None,
                 lr: float = 0.1, kernel: str = "auto") -> None:
        self.device = device or torch.device("cpu")
        self.lr = lr
        self.start, self.end = local_slice(batch_size, world_size, rank)
        self.tables = [t for t in tables if t.name in plan.data_parallel_tables]
        self.rows = [min(t.num_embeddings, row_cap) for t in self.tables]  # folded as shards are
        init = [init_rows(t, seed, 0, rows) for t, rows in zip(self.tables, self.rows)]
        self.kernel = resolve_kernel(kernel, self.device.type)
        if self.kernel == "fbgemm_tbe":
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen
            self._tbe = DenseTableBatchedEmbeddingBagsCodegen(
                [(rows, t.embedding_dim) for t, rows in zip(self.tables, self.rows)],
                use_cpu=self.device.type == "cpu").to(self.device)
            with torch.no_grad():
                for w, values in zip(self._tbe.split_embedding_weights(), init):
                    w.copy_(values)
            self.params = [self._tbe.weights]
        else:
            self.params = [w.to(self.device).requires_grad_() for w in init]
        offsets, offset = {}, 0
        for t in tables:  # the columns of each table in the features, tables side by side
            offsets[t.name] = offset
            offset += t.embedding_dim
        self.columns = torch.tensor([offsets[t.name] + c for t in self.tables for c in range(t.embedding_dim)],
                                    dtype=torch.long, device=self.device)

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    def prepare(self, lookups: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(indices, offsets) of each replicated table for this rank's samples."""
        out = []
        for t, rows in zip(self.tables, self.rows):
            ids, lengths = lookups[t.name]
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            ids, lengths = ids[bounds[self.start]:bounds[self.end]], lengths[self.start:self.end]
            idx, off = local_lookups(ids, lengths, 0, t.num_embeddings, t.num_embeddings, rows)
            out.append((idx.to(self.device), off.to(self.device)))
        return out

    def lookup(self, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Pooled embeddings of the replicated tables for this rank's samples, (b_rank, their widths)."""
        if self.kernel == "fbgemm_tbe":
            indices, offsets, base = [], [], 0
            for idx, off in inputs:  # one batch of all tables: offsets run on, the total appended
                indices.append(idx)
                offsets.append(off + base)
                base += int(idx.numel())
            offsets.append(torch.tensor([base], dtype=torch.long, device=self.device))
            return self._tbe(torch.cat(indices), torch.cat(offsets))
        return torch.cat([F.embedding_bag(idx, w, off, mode="sum") for w, (idx, off) in zip(self.params, inputs)],
                         dim=1)

    def add_to(self, features: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """The features (b_rank, all table widths) with the replicated tables' columns filled in."""
        return features.index_add(1, self.columns, pooled)

    def step(self) -> tuple[float, float]:
        """Sum the gradients over ranks (one all-reduce), then the SGD update. Returns the
        all-reduce's (wall, thread CPU) seconds."""
        grads = [w.grad if w.grad is not None else torch.zeros_like(w) for w in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        start, start_thread = time.perf_counter(), time.thread_time()
        dist.all_reduce(flat)
        if flat.device.type == "cuda":
            torch.cuda.synchronize(flat.device)
        elapsed = (time.perf_counter() - start, time.thread_time() - start_thread)
        with torch.no_grad():
            for w, g in zip(self.params, torch.split(flat, [w.numel() for w in self.params])):
                w.add_(g.view_as(w), alpha=-self.lr)
                w.grad = None
        return elapsed

    def table_weights(self) -> list[tuple[Shard, np.ndarray]]:
        """(whole-table shard, weights) of every replica, as ``ShardedEmbeddings.shard_weights``."""
        weights = self._tbe.split_embedding_weights() if self.kernel == "fbgemm_tbe" else self.params
        return [(Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, 0), w.detach().cpu().clone().numpy())
                for t, w in zip(self.tables, weights)]
