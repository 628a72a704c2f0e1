"""Embedding optimizers: their names, the memory their state takes, and fbgemm's fused kinds.

A shard's memory is its weights plus its optimizer state, counted as fbgemm's TBE allocates
it: the state in fp32 whatever the weights' precision (``STATE_BYTES``; TBE's ``momentum1``
and ``momentum2``):

* ``sgd``: no state;
* ``adagrad``: one fp32 accumulator per weight;
* ``rowwise-adagrad``: one fp32 accumulator per row (``rows x 4`` bytes; TorchRec spreads
  the same ``rows x 4`` over a table's column shards, TBE keeps it per shard);
* ``adam``: two fp32 moments per weight.

With fp32 weights this is TorchRec's storage estimate (``calculate_shard_storages``); with
fp16 or int8 weights TorchRec counts the state at the weights' precision, below what TBE
allocates (an fp16 table trained with adagrad holds 1.5x TorchRec's count; the runtime's
memory check, ``runtime.memory``, measures it).

Every memory check (search, plan validation, ``plan show``) goes through ``shard_bytes``.
"""
from __future__ import annotations

from typing import Iterable

from .errors import NeuroShardError

OPTIMIZERS = ("sgd", "adagrad", "rowwise-adagrad", "adam")
DEFAULT_OPTIMIZER = "sgd"
#: older spellings (``collect --optimizer``, fbgemm's names) -> the optimizer
ALIASES = {"exact_sgd": "sgd", "exact_adagrad": "adagrad", "exact_rowwise_adagrad": "rowwise-adagrad",
           "rowwise_adagrad": "rowwise-adagrad"}
#: fbgemm ``EmbOptimType`` member of each optimizer (fused into TBE's backward)
FBGEMM_OPTIMIZERS = {"sgd": "EXACT_SGD", "adagrad": "EXACT_ADAGRAD", "rowwise-adagrad": "EXACT_ROWWISE_ADAGRAD",
                     "adam": "ADAM"}
#: the optimizers fbgemm-gpu-cpu's TBE runs on CPU (ADAM asserts "not supported in CPU mode")
CPU_OPTIMIZERS = ("sgd", "adagrad", "rowwise-adagrad")
#: bytes of the row-wise adagrad accumulator per row (fp32)
ROWWISE_STATE_BYTES = 4
#: bytes of each element of a per-weight optimizer state (adagrad's sum, adam's moments): fp32
STATE_BYTES = 4


def check_optimizer(name: object, where: str = "optimizer") -> str:
    """The optimizer ``name`` (an alias allowed); one-line NeuroShardError naming the choices."""
    name = ALIASES.get(name, name) if isinstance(name, str) else name
    if name not in OPTIMIZERS:
        raise NeuroShardError(f"{where}: unknown optimizer {name!r} (choose from {', '.join(OPTIMIZERS)})")
    return name


def row_bytes(num_cols: int, bytes_per_element: int, optimizer: str = DEFAULT_OPTIMIZER) -> int:
    """Bytes one row of a shard of ``num_cols`` columns takes: weights plus optimizer state,
    the state in fp32 (``num_cols`` may be a numpy array)."""
    weights = num_cols * bytes_per_element
    if optimizer == "sgd":
        return weights
    if optimizer == "adagrad":
        return weights + num_cols * STATE_BYTES
    if optimizer == "rowwise-adagrad":
        return weights + ROWWISE_STATE_BYTES
    if optimizer == "adam":
        return weights + 2 * num_cols * STATE_BYTES
    raise NeuroShardError(f"unknown optimizer {optimizer!r} (choose from {', '.join(OPTIMIZERS)})")


def shard_bytes(num_rows: int, num_cols: int, bytes_per_element: int, optimizer: str = DEFAULT_OPTIMIZER) -> int:
    """Memory of a shard: weights plus ``optimizer``'s state."""
    return num_rows * row_bytes(num_cols, bytes_per_element, optimizer)


def tables_bytes(tables: Iterable, bytes_per_element: int, optimizer: str = DEFAULT_OPTIMIZER) -> int:
    """Memory of whole tables (anything with ``num_embeddings`` and ``embedding_dim``): weights
    plus ``optimizer``'s state."""
    return sum(shard_bytes(t.num_embeddings, t.embedding_dim, bytes_per_element, optimizer) for t in tables)
