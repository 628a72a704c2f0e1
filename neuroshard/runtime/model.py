"""The DLRM the runtime trains: deterministic embedding initialisation, synthetic
batches, the dense part (bottom MLP, dot interaction, top MLP) and an unsharded
single-process reference model.

Everything here is shared by the sharded runtime and the reference, so the two
see the same weights and the same batches: a table's rows are initialised block
by block from a per-table seed, so any rectangle of a table (a shard) can be made
without building the whole table.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..constants import batch_shares
from ..datasets.sampler import draw_lookups
from ..execution.dense import build_dense
from ..execution.kernels import FusedEmbedding, local_lookups
from ..model_spec import DEFAULT_MODEL, ModelSpec
from ..tables import Table

#: rows per deterministic initialisation block (a shard's rows are made block by block)
INIT_BLOCK_ROWS = 4096
NUM_DENSE_FEATURES = DEFAULT_MODEL.dense_features


def table_seed(table: Table, seed: int) -> int:
    """The seed of one table's initial weights."""
    return (zlib.crc32(table.name.encode()) * 1_000_003 + seed) % (2**62)


def init_rows(table: Table, seed: int, row_start: int, num_rows: int,
              col_start: int = 0, num_cols: int | None = None) -> torch.Tensor:
    """Initial weights of rows [row_start, row_start+num_rows) and the given columns of
    ``table``: uniform in +-1/sqrt(num_embeddings), the same values whatever the slicing."""
    num_cols = table.embedding_dim - col_start if num_cols is None else num_cols
    bound = 1.0 / float(np.sqrt(table.num_embeddings))
    base = table_seed(table, seed)
    out = torch.empty(num_rows, num_cols)
    first, last = row_start // INIT_BLOCK_ROWS, (row_start + num_rows - 1) // INIT_BLOCK_ROWS
    gen = torch.Generator()
    for block in range(first, last + 1):
        b0 = block * INIT_BLOCK_ROWS
        rows_in_block = min(INIT_BLOCK_ROWS, table.num_embeddings - b0)
        gen.manual_seed(base + block)
        values = torch.rand(rows_in_block, table.embedding_dim, generator=gen) * (2 * bound) - bound
        lo, hi = max(row_start, b0), min(row_start + num_rows, b0 + rows_in_block)
        out[lo - row_start:hi - row_start] = values[lo - b0:hi - b0, col_start:col_start + num_cols]
    return out


# ------------------------------------------------------------------ batches
@dataclass
class Batch:
    """One global batch: dense features, labels and each table's lookups
    (row ids and lookups per sample, as numpy arrays)."""

    dense: torch.Tensor
    labels: torch.Tensor
    lookups: dict[str, tuple[np.ndarray, np.ndarray]]

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A seed for one step's data, independent of the others."""
    return int(np.random.SeedSequence([seed, step, salt]).generate_state(1)[0])


def make_batch(tables: Sequence[Table], batch_size: int, step: int, seed: int,
               num_dense: int = NUM_DENSE_FEATURES) -> Batch:
    """The global batch of ``step``: lookups from each table's access distribution
    (or its recorded indices), dense features and labels random but deterministic.

    Only the tables given are sampled (a rank samples the tables it holds shards of)."""
    gen = torch.Generator().manual_seed(step_seed(seed, step))
    dense = torch.randn(batch_size, num_dense, generator=gen)
    noise = torch.randn(batch_size, generator=gen)
    labels = ((dense[:, 0] + noise) > 0).float()
    lookups = {}
    for table in tables:
        # Drawn uncached: a cache would keep every step's batch.
        salt = zlib.crc32(table.name.encode())
        rows, lengths = draw_lookups(table, batch_size, seed=step_seed(seed, step, salt))
        lookups[table.name] = (np.asarray(rows, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
    return Batch(dense, labels, lookups)


def local_slice(batch_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of the samples of the global batch that ``rank`` trains on."""
    shares = batch_shares(batch_size, world_size)
    start = sum(shares[:rank])
    return start, start + shares[rank]


# --------------------------------------------------------------- dense part
def loss_sum(logits: torch.Tensor, labels: torch.Tensor, global_batch_size: int) -> torch.Tensor:
    """This process's share of the global mean BCE loss (summed over processes it is the mean)."""
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / global_batch_size


# ----------------------------------------------------------- the reference
@dataclass
class ReferenceResult:
    losses: list[float]
    weights: dict[str, torch.Tensor]
    optimizer_state: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # per table, fused optimizers


def train_reference(tables: Sequence[Table], steps: int, batch_size: int, lr: float,
                    seed: int = 0, optimizer: str = "sgd", weights_precision: str = "fp32",
                    model: ModelSpec = DEFAULT_MODEL) -> ReferenceResult:
    """Train the same DLRM unsharded in this process (full tables, plain SGD; another
    ``optimizer`` or fp16 ``weights_precision``: one fbgemm TBE of the full tables with that
    optimizer and precision): what a sharded run must reproduce."""
    tables = list(tables)
    if optimizer != "sgd" or weights_precision != "fp32":
        return _train_reference_fused(tables, steps, batch_size, lr, seed, optimizer, weights_precision, model)
    dense = build_dense(tables, seed, model)
    weights = [init_rows(t, seed, 0, t.num_embeddings).requires_grad_() for t in tables]
    opt = torch.optim.SGD(dense.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        batch = make_batch(tables, batch_size, step, seed, model.dense_features)
        pooled = []
        for t, w in zip(tables, weights):
            rows, lengths = batch.lookups[t.name]
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
            pooled.append(F.embedding_bag(torch.from_numpy(rows), w, offsets, mode="sum", sparse=True))
        loss = loss_sum(dense(batch.dense, torch.cat(pooled, dim=1)), batch.labels, batch_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for w in weights:
                w.add_(w.grad, alpha=-lr)
                w.grad = None
        losses.append(float(loss.detach()))
    return ReferenceResult(losses, {t.name: w.detach() for t, w in zip(tables, weights)})


def _train_reference_fused(tables: list[Table], steps: int, batch_size: int, lr: float, seed: int,
                           optimizer: str, weights_precision: str = "fp32",
                           model: ModelSpec = DEFAULT_MODEL) -> ReferenceResult:
    """``train_reference`` with the embeddings as one unsharded fbgemm TBE (every table
    whole) of ``weights_precision`` updated by ``optimizer``."""
    dense = build_dense(tables, seed, model)
    fused = FusedEmbedding([(t.num_embeddings, t.embedding_dim) for t in tables], "fbgemm_tbe", "cpu", lr=lr,
                           init=[init_rows(t, seed, 0, t.num_embeddings) for t in tables], optimizer=optimizer,
                           weights_precision=weights_precision)
    opt = torch.optim.SGD(dense.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        batch = make_batch(tables, batch_size, step, seed, model.dense_features)
        per_table = [local_lookups(*batch.lookups[t.name], 0, t.num_embeddings, t.num_embeddings, t.num_embeddings)
                     for t in tables]
        pooled = fused.pooled(fused.prepare(per_table))
        loss = loss_sum(dense(batch.dense, pooled), batch.labels, batch_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    state = dict(zip((t.name for t in tables), fused.optimizer_state()))
    return ReferenceResult(losses, {t.name: w for t, w in zip(tables, fused.weights())}, state)
