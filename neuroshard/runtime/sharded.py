"""Sharded embeddings: each rank holds its shards of the plan, looks them up for the
global batch, and an all-to-all hands every rank the pooled embeddings of its own
slice of the batch.

The exchange and its layout are ``neuroshard.execution.exchange.PooledExchange`` (the
communication benchmark times the same code).

A rank's shards run as one ``neuroshard.execution.kernels.FusedEmbedding``, the fused kernel
the cost data is measured with (fbgemm TBE with exact SGD fused into its backward,
or the width-grouped ``embedding_bag`` fallback), with rows capped as there, and with
the weights precision of the plan (``bytes_per_element`` 2: fp16 weights). The plan's
``comm_precision`` is what its all-to-all sends.

Shards whose rows live in host memory or on SSD (``Shard.tier``) are not in the fused
kernel: they train on a bounded device cache in front of a backing store
(``runtime.cached``), their pooled outputs put back in shard order beside the kernel's.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..constants import DEFAULT_MAX_ROWS, precision_of, trained_precision
from ..execution.exchange import PooledExchange
from ..execution.kernels import FusedEmbedding, FusedInputs, local_lookups
from ..plan import Plan, Shard
from ..tables import Table
from .cached import CachedShards
from .memory import HeldMemory, storage_bytes
from .model import init_rows
from .replicated import ReplicatedTables

log = logging.getLogger(__name__)


@dataclass
class PhaseTimes:
    """Seconds spent in the communication phases of one step (filled by the all-to-all):
    wall time, and this thread's CPU time (``*_thread``, subtracted from compute timed
    on the thread clock)."""

    fwd_comm: float = 0.0
    bwd_comm: float = 0.0
    fwd_comm_thread: float = 0.0
    bwd_comm_thread: float = 0.0
    allreduce: float = 0.0         # the gradient all-reduce of data-parallel tables
    allreduce_thread: float = 0.0

    def reset(self) -> None:
        self.fwd_comm = self.bwd_comm = self.fwd_comm_thread = self.bwd_comm_thread = 0.0
        self.allreduce = self.allreduce_thread = 0.0


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on an accelerator (a no-op on CPU), so clocks are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PooledAllToAll(torch.autograd.Function):
    """Forward: the all-to-all of pooled embeddings; backward: the reverse all-to-all
    of their gradients. Each direction adds its wall time to ``times``."""

    @staticmethod
    def forward(ctx, pooled: torch.Tensor, exchange: PooledExchange, times: PhaseTimes) -> torch.Tensor:
        ctx.exchange, ctx.times = exchange, times
        start, start_thread = time.perf_counter(), time.thread_time()
        out = exchange.forward(pooled)
        synchronize(exchange.device)
        times.fwd_comm += time.perf_counter() - start
        times.fwd_comm_thread += time.thread_time() - start_thread
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start, start_thread = time.perf_counter(), time.thread_time()
        out = ctx.exchange.backward(grad)
        synchronize(ctx.exchange.device)
        ctx.times.bwd_comm += time.perf_counter() - start
        ctx.times.bwd_comm_thread += time.thread_time() - start_thread
        return out, None, None


@dataclass
class LocalShard:
    """A shard this rank holds: its place in the table and the rows allocated for it
    (fewer than the shard's when capped: lookups fold onto them)."""

    shard: Shard
    rows: int


def plan_weights_precision(plan: Plan) -> str:
    """The weights precision the runtime trains ``plan`` with: fp16 for ``bytes_per_element``
    2, else fp32 (int8 counts in memory only: said once, as the search says it)."""
    precision = trained_precision(plan.bytes_per_element)
    if precision != precision_of(plan.bytes_per_element):
        log.warning("bytes_per_element %d (%s) cannot be trained here: training with fp32 weights",
                    plan.bytes_per_element, precision_of(plan.bytes_per_element))
    return precision


def capped_shards(plan: Plan, row_cap: int, rank: int | None = None) -> list[str]:
    """The shards of ``plan`` (on ``rank``; None: every device) whose rows exceed ``row_cap``, each as
    ``"'table' rows [a, b)"`` (on device d, when every device is asked): the runtime allocates at most
    ``row_cap`` rows for them and folds their lookups onto those."""
    devices = range(plan.num_devices) if rank is None else [rank]
    return [f"'{s.table}' rows [{s.row_offset:,}, {s.row_offset + s.num_rows:,})"
            + ("" if rank is not None else f" on device {d}")
            for d in devices for s in plan.shards_on(d) if s.num_rows > row_cap]


def row_cap_line(capped: list[str], row_cap: int) -> str:
    """One line saying which shards the row cap folds (``capped_shards``)."""
    return (f"{len(capped)} shard(s) allocate at most {row_cap:,} rows (row cap; lookups fold onto them): "
            + ", ".join(capped[:4]) + (" ..." if len(capped) > 4 else ""))


class ShardedEmbeddings:
    """This rank's shards of the plan: lookup (one fused kernel for all of them in device
    memory; the cached ones on their caches), exchange, and the update of the shard weights
    with the plan's optimizer (inside TBE's backward, or ``step()`` for the fallback's and
    the cached shards' SGD). ``close()`` removes the SSD backing stores' files."""

    def __init__(self, plan: Plan, tables: Sequence[Table], rank: int, world_size: int,
                 batch_size: int, seed: int = 0, row_cap: int = DEFAULT_MAX_ROWS,
                 device: torch.device | None = None, kernel: str = "auto", lr: float = 0.1) -> None:
        self.device = device or torch.device("cpu")
        self.tables = {t.name: t for t in tables}
        self.batch_size = batch_size
        self.shards: list[LocalShard] = []   # every shard here, in plan order (the exchange's)
        for s in plan.shards_on(rank):
            self.shards.append(LocalShard(s, min(s.num_rows, row_cap)))
        capped = capped_shards(plan, row_cap, rank)
        if capped:  # the launching process warns once per plan (trainer.run); here only at info
            log.info("rank %d: %s", rank, row_cap_line(capped, row_cap))
        precision = plan_weights_precision(plan) if self.shards else "fp32"
        # device shards run as one fused kernel; cached shards on their caches (``runtime.cached``)
        self._on_device = [i for i, ls in enumerate(self.shards) if ls.shard.tier.on_device]
        self._off_device = [i for i, ls in enumerate(self.shards) if not ls.shard.tier.on_device]
        device_shards = [self.shards[i] for i in self._on_device]
        weights = [init_rows(self.tables[ls.shard.table], seed, ls.shard.row_offset, ls.rows, ls.shard.col_offset,
                             ls.shard.num_cols) for ls in device_shards]
        self.fused = (FusedEmbedding([(ls.rows, ls.shard.num_cols) for ls in device_shards], kernel, self.device,
                                     lr=lr, init=weights, optimizer=plan.optimizer,
                                     weights_precision=precision) if device_shards else None)
        self.cached = (CachedShards([(self.shards[i].shard, self.shards[i].rows) for i in self._off_device],
                                    self.tables, seed, self.device, lr, precision) if self._off_device else None)
        # columns of [kernel outputs, cached outputs] in shard order (None: the kernel's alone)
        self._order = None
        if self.cached is not None:
            widths = [ls.shard.num_cols for ls in self.shards]
            starts = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64)
            placed = [c for i in self._on_device + self._off_device for c in range(starts[i], starts[i] + widths[i])]
            self._order = torch.from_numpy(np.argsort(np.asarray(placed, dtype=np.int64))).to(self.device)
        self.exchange = PooledExchange.for_plan(plan, tables, rank, world_size, batch_size, self.device)
        self.times = PhaseTimes()
        # data-parallel tables: a replica here, looked up for this rank's samples (``replicated``)
        self.replicated = (ReplicatedTables(plan, tables, rank, world_size, batch_size, seed, row_cap, self.device,
                                            lr, kernel) if plan.data_parallel_tables else None)
        self._replicated_inputs: list = []
        self._replicated_pooled: torch.Tensor | None = None

    @property
    def table_names(self) -> list[str]:
        """The tables this rank holds a shard or a replica of (the lookups it needs)."""
        replicas = self.replicated.table_names if self.replicated is not None else []
        return sorted({ls.shard.table for ls in self.shards} | set(replicas))

    def prepare(self, lookups: dict[str, tuple[np.ndarray, np.ndarray]]) -> FusedInputs | None:
        """Turn a batch's lookups into the fused kernel's inputs: keep the lookups in each
        shard's row range, make them local, fold them onto the allocated rows (the replicated
        tables' inputs, this rank's samples, are kept for ``lookup``)."""
        if self.replicated is not None:
            self._replicated_inputs = self.replicated.prepare(lookups)
        if not self.shards:
            return None
        per_shard = []
        cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        for ls in self.shards:
            s = ls.shard
            key = (s.table, s.row_offset, s.num_rows)
            if key not in cache:
                rows, lengths = lookups[s.table]
                cache[key] = local_lookups(rows, lengths, s.row_offset, s.num_rows,
                                           self.tables[s.table].num_embeddings, ls.rows)
            per_shard.append(cache[key])
        if self.cached is not None:  # the cache moves of this batch, before any timing
            self.cached.prepare([per_shard[i] for i in self._off_device])
        return self.fused.prepare([per_shard[i] for i in self._on_device]) if self.fused is not None else None

    @property
    def kernel(self) -> str | None:
        """The fused kernel this rank runs (None when it holds no shard)."""
        return self.fused.kernel if self.fused is not None else None

    def lookup(self, inputs: FusedInputs | None) -> torch.Tensor:
        """Pooled outputs of this rank's shards for the global batch, side by side (B, W_rank);
        the replicated tables are looked up too (for this rank's samples, kept for the exchange)."""
        if self.replicated is not None:
            self._replicated_pooled = self.replicated.lookup(self._replicated_inputs)
        if not self.shards:  # a rank without shards still takes part in the exchange
            return torch.zeros(self.batch_size, 0, device=self.device, requires_grad=True)
        if self.cached is None:
            return self.fused.pooled(inputs)
        parts = ([self.fused.pooled(inputs)] if self.fused is not None else []) + [self.cached.pooled()]
        return torch.cat(parts, dim=1).index_select(1, self._order)

    @property
    def cache_counts(self) -> dict[str, list[float]]:
        """The last batch's cache counts per table: [unique rows, misses, miss-path seconds]
        (empty without cached shards)."""
        return self.cached.last_counts if self.cached is not None else {}

    def exchange_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        """The all-to-all (autograd-aware): this rank's slice of the batch, all tables (the
        replicated ones added from this rank's own lookup)."""
        features = PooledAllToAll.apply(pooled, self.exchange, self.times)
        if self.replicated is not None:
            features = self.replicated.add_to(features, self._replicated_pooled)
        return features

    def step(self) -> None:
        """Finish the update of the shard weights after the backward; the replicated tables'
        gradients are all-reduced (timed in ``times.allreduce``) and applied."""
        if self.fused is not None:
            self.fused.step()
        if self.cached is not None:
            self.cached.step()
        if self.replicated is not None:
            wall, thread = self.replicated.step()
            self.times.allreduce += wall
            self.times.allreduce_thread += thread

    def shard_weights(self) -> list[tuple[Shard, np.ndarray]]:
        """(shard, weights) of every shard this rank holds, read back from the kernel, and of
        every replica (as a whole-table shard)."""
        replicas = self.replicated.table_weights() if self.replicated is not None else []
        weights: list = [None] * len(self.shards)
        if self.fused is not None:
            for i, w in zip(self._on_device, self.fused.weights()):
                weights[i] = w.numpy()
        if self.cached is not None:  # the backing stores with the cached rows over them
            for i, w in zip(self._off_device, self.cached.weights()):
                weights[i] = w
        return [(ls.shard, w) for ls, w in zip(self.shards, weights)] + replicas

    def memory_held(self) -> HeldMemory:
        """The embedding storage this rank holds (``runtime.memory``): the fused kernel's
        weights and optimizer state, the replicas, the caches and their bookkeeping; the cached
        shards' backing stores apart."""
        held = self.cached.held() if self.cached is not None else HeldMemory()
        held.device_bytes += storage_bytes([self.fused, self.replicated])
        held.kernels = (self.fused is not None) + (self.replicated is not None)
        return held

    def close(self) -> None:
        """Release what outlives the process otherwise: the SSD backing stores' files."""
        if self.cached is not None:
            self.cached.close()
