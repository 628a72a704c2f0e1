"""The exchange of pooled embeddings between devices, shared by the training runtime
and the communication benchmark (so the benchmark times what training runs, as
``kernels`` does for compute).

Layout. Rank ``p`` holds shards of total width ``W_p``; its pooled output for the
global batch is a ``(B, W_p)`` matrix whose rows ``[start_q, end_q)`` go to rank
``q`` (``batch_shares``). Rank ``q`` receives ``(b_q, W_p)`` from every ``p``, lays
them side by side and adds each received column into its output column
(``index_add_``): column slices land in column order, and the partial sums of
row-wise shards are reduced at the receiver. Backward runs the same in reverse: the
receiver picks each shard's gradient columns (the same gradient for every row-wise
partial sum) and a reverse all-to-all sends them home.

Precision. With ``comm_precision`` ``fp16`` or ``bf16`` what crosses the network is
cast to that type just before each all-to-all and back to fp32 just after (pooled
embeddings forward, their gradients backward): half the bytes; partial sums are
still added in fp32 at the receiver. ``fp32`` sends the tensors as they are.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
import torch.distributed as dist

from ..constants import batch_shares
from ..validate import check_comm_precision

if TYPE_CHECKING:
    from ..plan import Plan
    from ..tables import Table

#: element type of what the all-to-all sends, by the plan's ``comm_precision``
COMM_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class PooledExchange:
    """The all-to-all of pooled embeddings between ranks, and its reverse, with the
    column layout around them (what the communication benchmark times too).

    ``widths[p]`` is the width of rank ``p``'s pooled output; ``dest_cols`` the output
    column of every received column, sources in rank order; ``output_width`` the
    width of the assembled features; ``comm_precision`` the element type sent
    (``COMM_DTYPES``)."""

    def __init__(self, rank: int, world_size: int, batch_size: int, widths: Sequence[int],
                 dest_cols: Sequence[int], output_width: int, device: torch.device,
                 comm_precision: str = "fp32") -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.dtype = COMM_DTYPES[check_comm_precision(comm_precision)]
        self.batch_sizes = batch_shares(batch_size, world_size)
        self.widths = [int(w) for w in widths]
        self.output_width = int(output_width)
        self.dest_cols = torch.as_tensor(dest_cols, dtype=torch.long, device=device)

    @classmethod
    def for_plan(cls, plan: "Plan", tables: Sequence["Table"], rank: int, world_size: int, batch_size: int,
                 device: torch.device) -> "PooledExchange":
        """The exchange of ``plan``: each received column lands in its table's column of
        the features (tables side by side in order)."""
        table_offset, offset = {}, 0
        for t in tables:
            table_offset[t.name] = offset
            offset += t.embedding_dim
        widths = [sum(s.num_cols for s in plan.shards_on(p)) for p in range(world_size)]
        dest = []
        for p in range(world_size):
            for s in plan.shards_on(p):
                start = table_offset[s.table] + s.col_offset
                dest.extend(range(start, start + s.num_cols))
        return cls(rank, world_size, batch_size, widths, dest, offset, device, plan.comm_precision)

    @classmethod
    def for_widths(cls, widths: Sequence[int], rank: int, world_size: int, batch_size: int,
                   device: torch.device, comm_precision: str = "fp32") -> "PooledExchange":
        """An exchange of pooled outputs of these widths, each column its own output column
        (what the communication benchmark runs for a sample of widths)."""
        total = int(sum(widths))
        return cls(rank, world_size, batch_size, widths, range(total), total, device, comm_precision)

    def _all_to_all(self, send: torch.Tensor, output_sizes: list[int], input_sizes: list[int]) -> torch.Tensor:
        """One all-to-all of a flat fp32 tensor, sent as ``self.dtype``; fp32 back."""
        send = send.to(self.dtype)
        received = torch.empty(sum(output_sizes), dtype=self.dtype, device=self.device)
        dist.all_to_all_single(received, send, output_split_sizes=output_sizes, input_split_sizes=input_sizes)
        return received.float()

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, W_rank) pooled outputs of this rank's shards -> (b_rank, all table widths)."""
        b = self.batch_sizes[self.rank]
        received = self._all_to_all(pooled.contiguous().view(-1), [b * w for w in self.widths],
                                    [n * self.widths[self.rank] for n in self.batch_sizes])
        parts = [chunk.view(b, w) for chunk, w in zip(torch.split(received, [b * w for w in self.widths]),
                                                       self.widths)]
        out = torch.zeros(b, self.output_width, device=self.device)
        return out.index_add_(1, self.dest_cols, torch.cat(parts, dim=1))

    def backward(self, grad: torch.Tensor) -> torch.Tensor:
        """(b_rank, all table widths) gradient -> (B, W_rank) gradient of this rank's shards."""
        b = self.batch_sizes[self.rank]
        picked = grad.index_select(1, self.dest_cols)
        send = torch.cat([part.contiguous().view(-1) for part in torch.split(picked, self.widths, dim=1)])
        width = self.widths[self.rank]
        received = self._all_to_all(send, [n * width for n in self.batch_sizes], [b * w for w in self.widths])
        return received.view(sum(self.batch_sizes), width)
