"""Augmentation and sharding tasks, as in the NeuroShard paper.

- Widths: a table is re-used at every width obtained by halving its maximum
  (128, 64, ..., 4), all multiples of 4 so column-wise splits stay possible.
- Combinations: random tables at random widths whose total size fits a memory cap.
- Splits by table: train and test sets share no table, so later stages show they
  generalise to tables they have never seen.
- Tasks: a table combination plus a device count and per-device memory. A task is
  feasible by construction: its total size is at most ``max_fill`` (default 0.7) of the
  total device memory, and every table fits one device once split column-wise into at
  most ``num_devices`` shards of widths that are multiples of 4 (``fits_by_columns``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..constants import FP32_BYTES
from ..errors import InfeasibleError, NeuroShardError
from ..tables import Table, TableSet
from .synthetic import generate


def augment_widths(max_dim: int = 128, min_dim: int = 4) -> list[int]:
    """Widths from ``max_dim`` down by halving, multiples of 4 and >= ``min_dim``:
    ``augment_widths()`` is [128, 64, 32, 16, 8, 4]."""
    if max_dim < 4 or max_dim % 4:
        raise NeuroShardError(f"max_dim must be a multiple of 4 and >= 4, got {max_dim}")
    widths, dim = [], max_dim
    while dim >= max(min_dim, 4) and dim % 4 == 0:
        widths.append(dim)
        dim //= 2
    return widths


def augment_table(table: Table, dim: int) -> Table:
    """The same table (rows, lookups, access) at width ``dim``, named ``<name>_d<dim>``."""
    if dim < 1:
        raise NeuroShardError(f"table '{table.name}': width must be >= 1, got {dim}")
    extra = dict(table.extra)
    extra.setdefault("source_table", table.name)
    return Table(f"{table.name}_d{dim}", table.num_embeddings, int(dim), table.pooling_factor,
                 dict(table.access), extra, base_dir=table.base_dir)


def widest_column_shard(dim: int, num_devices: int) -> int:
    """Width of the widest shard when ``dim`` columns are split evenly over at most
    ``num_devices`` shards whose widths are multiples of 4 (no split unless dim is a
    multiple of 4 and at least 8)."""
    if dim % 4 or dim < 8:
        return dim
    parts = min(num_devices, dim // 4)
    return 4 * math.ceil(dim / 4 / parts)


def _fits(num_rows: int, dim: int, num_devices: int, device_memory_bytes: int, bytes_per_element: int) -> bool:
    return num_rows * widest_column_shard(dim, num_devices) * bytes_per_element <= device_memory_bytes


def fits_by_columns(table: Table, num_devices: int, device_memory_bytes: int, bytes_per_element: int = FP32_BYTES) -> bool:
    """Whether the table fits one device once split column-wise over ``num_devices``."""
    return _fits(table.num_embeddings, table.embedding_dim, num_devices, device_memory_bytes, bytes_per_element)


def sample_table_combination(tables: Sequence[Table] | TableSet, max_tables: int, memory_bytes: float,
                             rng: np.random.Generator, dims: Sequence[int] | None = None,
                             bytes_per_element: int = FP32_BYTES, num_devices: int | None = None,
                             device_memory_bytes: int | None = None) -> list[Table]:
    """Up to ``max_tables`` distinct tables in random order, each at a random width from
    ``dims`` (default ``augment_widths()``), whose total size stays within ``memory_bytes``.
    A table that does not fit at the drawn width takes a random narrower one that fits, or
    is skipped. With ``num_devices`` and ``device_memory_bytes``, only widths at which the
    table ``fits_by_columns`` are used."""
    dims = sorted(set(dims or augment_widths()), reverse=True)
    chosen, used = [], 0
    for i in rng.permutation(len(tables)):
        if len(chosen) >= max_tables:
            break
        table = tables[int(i)]
        dim = int(rng.choice(dims))
        room = memory_bytes - used
        options = [d for d in dims if d <= dim and table.num_embeddings * d * bytes_per_element <= room]
        if num_devices is not None and device_memory_bytes is not None:
            options = [d for d in options
                       if _fits(table.num_embeddings, d, num_devices, device_memory_bytes, bytes_per_element)]
        if not options:
            continue
        if dim not in options:
            dim = int(rng.choice(options))
        chosen.append(augment_table(table, dim))
        used += table.num_embeddings * dim * bytes_per_element
    return chosen


def split_by_table(tables: TableSet, test_fraction: float = 0.2, seed: int = 0) -> tuple[TableSet, TableSet]:
    """(train, test): a random split of the tables themselves, at least one in each."""
    if not 0 < test_fraction < 1:
        raise NeuroShardError(f"tables '{tables.name}': test_fraction must be in (0, 1), got {test_fraction}")
    if len(tables) < 2:
        raise NeuroShardError(f"tables '{tables.name}': need at least 2 tables to split, got {len(tables)}")
    order = np.random.default_rng(seed).permutation(len(tables))
    num_test = min(len(tables) - 1, max(1, round(test_fraction * len(tables))))
    test_ids = set(order[:num_test].tolist())
    train = [t for i, t in enumerate(tables) if i not in test_ids]
    test = [t for i, t in enumerate(tables) if i in test_ids]
    return (TableSet(f"{tables.name}-train", train, tables.batch_size, dict(tables.extra)),
            TableSet(f"{tables.name}-test", test, tables.batch_size, dict(tables.extra)))


@dataclass
class Task:
    """A sharding task: tables to place on ``num_devices`` devices of ``device_memory_bytes``."""

    tables: TableSet
    num_devices: int
    device_memory_bytes: int
    bytes_per_element: int = FP32_BYTES
    extra: dict = field(default_factory=dict)

    @property
    def memory_fill(self) -> float:
        """Total table size over total device memory."""
        return self.tables.total_bytes(self.bytes_per_element) / (self.num_devices * self.device_memory_bytes)

    def is_feasible(self, max_fill: float = 0.7) -> bool:
        return self.memory_fill <= max_fill + 1e-12 and all(
            fits_by_columns(t, self.num_devices, self.device_memory_bytes, self.bytes_per_element)
            for t in self.tables)


def sample_tasks(tables: TableSet, num_tasks: int, num_tables: tuple[int, int] = (10, 60),
                 dims: Sequence[int] | None = None, num_devices: int = 4,
                 device_memory_bytes: int = 4 * 2**30, seed: int = 0, bytes_per_element: int = FP32_BYTES,
                 max_fill: float = 0.7, max_tries: int = 20) -> list[Task]:
    """``num_tasks`` feasible tasks (see the module docstring), each drawing between
    ``num_tables[0]`` and ``num_tables[1]`` tables (capped by the set's size) at widths from
    ``dims`` (default 4..128 by halving). Same seed, same tasks."""
    low, high = num_tables
    high = min(high, len(tables))
    low = min(low, high)
    if low < 1:
        raise NeuroShardError(f"tables '{tables.name}': num_tables must allow at least 1 table, got {num_tables}")
    rng = np.random.default_rng(seed)
    cap = max_fill * num_devices * device_memory_bytes
    tasks = []
    for k in range(num_tasks):
        for _ in range(max_tries):
            want = int(rng.integers(low, high + 1))
            chosen = sample_table_combination(tables, want, cap, rng, dims, bytes_per_element,
                                              num_devices, device_memory_bytes)
            if len(chosen) >= low:
                break
        else:
            raise InfeasibleError(f"tables '{tables.name}': cannot fit {low} tables in {max_fill:.0%} of "
                                  f"{num_devices} x {device_memory_bytes} bytes after {max_tries} tries")
        task_tables = TableSet(f"{tables.name}-task{k}", chosen, tables.batch_size)
        tasks.append(Task(task_tables, num_devices, int(device_memory_bytes), bytes_per_element))
    return tasks


#: The benchmark split every stage agrees on: cost data is collected on the training
#: tables, experiments build tasks from the held-out ones (``neuroshard tables split`` defaults).
BENCHMARK_TEST_FRACTION = 0.3
BENCHMARK_SEED = 0


def benchmark_tables(preset: str = "dlrm-2021") -> tuple[TableSet, TableSet]:
    """(training, held-out) tables of the calibrated benchmark ``preset`` (seed 0)."""
    return split_by_table(generate(preset, seed=BENCHMARK_SEED), BENCHMARK_TEST_FRACTION, BENCHMARK_SEED)
