"""Width augmentation, table combinations under a memory cap, splits and tasks."""
import numpy as np
import pytest

from neuroshard.datasets.augment import (
    Task,
    augment_table,
    augment_widths,
    fits_by_columns,
    sample_table_combination,
    sample_tasks,
    split_by_table,
    widest_column_shard,
)
from neuroshard.errors import InfeasibleError, NeuroShardError
from neuroshard.tables import Table, TableSet


def _tables(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return TableSet("pool", [Table(f"t{i}", int(rng.integers(100, 200_000)), 64, float(rng.uniform(0.5, 20)),
                                   {"zipf_alpha": 1.05}) for i in range(n)], batch_size=1024)


def test_widths_halve_in_multiples_of_4():
    assert augment_widths() == [128, 64, 32, 16, 8, 4]
    assert augment_widths(128, 16) == [128, 64, 32, 16]
    assert augment_widths(96) == [96, 48, 24, 12]
    with pytest.raises(NeuroShardError):
        augment_widths(30)


def test_augment_table_keeps_rows_and_access():
    t = _tables(1)[0]
    a = augment_table(t, 16)
    assert (a.name, a.embedding_dim, a.num_embeddings, a.pooling_factor) == ("t0_d16", 16, t.num_embeddings,
                                                                             t.pooling_factor)
    assert a.access == t.access and a.access is not t.access and a.extra["source_table"] == "t0"


def test_combination_fits_memory_cap():
    tables = _tables()
    cap = 30_000_000
    for seed in range(5):
        combo = sample_table_combination(tables, 25, cap, np.random.default_rng(seed), dims=[4, 16, 64])
        assert 0 < len(combo) <= 25
        assert sum(t.size_bytes() for t in combo) <= cap
        assert len({t.extra["source_table"] for t in combo}) == len(combo)
        assert {t.embedding_dim for t in combo} <= {4, 16, 64}
    a = sample_table_combination(tables, 25, cap, np.random.default_rng(7))
    b = sample_table_combination(tables, 25, cap, np.random.default_rng(7))
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]


def test_split_by_table_is_disjoint_and_deterministic():
    tables = _tables()
    train, test = split_by_table(tables, 0.25, seed=3)
    assert len(test) == 10 and len(train) == 30
    assert not {t.name for t in train} & {t.name for t in test}
    assert {t.name for t in train} | {t.name for t in test} == {t.name for t in tables}
    assert [t.name for t in split_by_table(tables, 0.25, seed=3)[1]] == [t.name for t in test]
    assert [t.name for t in split_by_table(tables, 0.25, seed=4)[1]] != [t.name for t in test]
    with pytest.raises(NeuroShardError):
        split_by_table(tables, 1.0)


def test_column_split_feasibility():
    assert widest_column_shard(128, 4) == 32
    assert widest_column_shard(12, 4) == 4
    assert widest_column_shard(4, 8) == 4
    big = Table("big", 1000, 128, 1.0)
    assert fits_by_columns(big, 4, 1000 * 32 * 4) and not fits_by_columns(big, 2, 1000 * 32 * 4)


def test_sample_tasks_are_feasible_and_deterministic():
    tables = _tables()
    memory = 8_000_000
    tasks = sample_tasks(tables, 6, num_tables=(5, 15), num_devices=4, device_memory_bytes=memory, seed=1)
    assert len(tasks) == 6
    for task in tasks:
        assert isinstance(task, Task) and task.num_devices == 4 and task.device_memory_bytes == memory
        assert 5 <= len(task.tables) <= 15
        assert task.tables.total_bytes() <= 0.7 * 4 * memory
        assert task.is_feasible()
        assert all(t.embedding_dim in augment_widths() for t in task.tables)
    again = sample_tasks(tables, 6, num_tables=(5, 15), num_devices=4, device_memory_bytes=memory, seed=1)
    assert [t.tables.to_dict() for t in again] == [t.tables.to_dict() for t in tasks]
    other = sample_tasks(tables, 6, num_tables=(5, 15), num_devices=4, device_memory_bytes=memory, seed=2)
    assert [t.tables.to_dict() for t in other] != [t.tables.to_dict() for t in tasks]
    with pytest.raises(InfeasibleError):
        sample_tasks(tables, 1, num_tables=(10, 20), num_devices=1, device_memory_bytes=10_000, seed=0)
