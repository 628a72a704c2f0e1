"""A plan executed on real gloo processes trains exactly like the unsharded model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neuroshard.plan import Plan, Shard
from neuroshard.runtime.model import init_rows, train_reference
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.tables import Table

STEPS, BATCH, LR = 3, 48, 5.0

TABLES = [
    Table("t0", 300, 16, 3.0, {"zipf_alpha": 1.1}),
    Table("t1", 200, 8, 1.0),
    Table("t2", 250, 16, 2.0, {"zipf_alpha": 0.9, "row_order": "hottest_first"}),
    Table("t3", 180, 8, 2.5),
    Table("t4", 320, 16, 1.5, {"zipf_alpha": 1.2}),
]


def _rows(t: Table, n: int, col_offset: int = 0, num_cols: int | None = None, first_device: int = 0) -> list[Shard]:
    cuts = np.linspace(0, t.num_embeddings, n + 1).astype(int)
    num_cols = t.embedding_dim if num_cols is None else num_cols
    return [Shard(t.name, int(a), int(b - a), col_offset, num_cols, (first_device + i) % n)
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]


def _cols(t: Table, n: int, first_device: int = 0) -> list[Shard]:
    cuts = np.linspace(0, t.embedding_dim, n + 1).astype(int)
    return [Shard(t.name, 0, t.num_embeddings, int(a), int(b - a), (first_device + i) % n)
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]


def make_plan(kind: str, n: int) -> Plan:
    shards: list[Shard] = []
    for i, t in enumerate(TABLES):
        if kind == "table_wise":
            shards.append(Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % n))
        elif kind == "column_wise":
            shards += _cols(t, n, first_device=i)
        elif kind == "row_wise":
            shards += _rows(t, n, first_device=i)
        elif i == 0:  # mixed: t0 split along rows and columns
            half = t.embedding_dim // 2
            shards += _rows(t, n, 0, half) + _rows(t, n, half, half, first_device=1)
        elif i == 1:
            shards += _cols(t, n)
        elif i == 2:
            shards += _rows(t, n, first_device=1)
        else:
            shards.append(Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % n))
    plan = Plan(list(TABLES), shards, n, 10**9).validate()
    assert {plan.sharding_type(t.name) for t in TABLES} >= ({"mixed"} if kind == "mixed" else {kind})
    return plan


@pytest.fixture(scope="module")
def reference():
    return train_reference(TABLES, STEPS, BATCH, LR)


def test_init_rows_is_the_same_whatever_the_slicing():
    t = Table("big", 10_000, 12, 1.0)
    full = init_rows(t, 7, 0, t.num_embeddings)
    part = init_rows(t, 7, 4000, 300, col_start=4, num_cols=8)
    assert torch.equal(part, full[4000:4300, 4:12])
    assert not torch.equal(init_rows(t, 8, 0, 10), full[:10])


@pytest.mark.parametrize("kind,devices", [("table_wise", 2), ("column_wise", 2), ("row_wise", 2),
                                          ("mixed", 2), ("mixed", 3)])
def test_sharded_training_matches_unsharded(kind, devices, reference):
    plan = make_plan(kind, devices)
    result = run(RunConfig(plan, list(TABLES), devices, steps=STEPS, batch_size=BATCH, lr=LR,
                           collect_weights=True, timeout_s=60))
    assert result.world_size == devices and len(result.records) == devices
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    for t in TABLES:
        want = reference.weights[t.name].numpy()
        got = result.weights[t.name]
        assert not np.isnan(got).any()
        # the training moved the weights, and both sides moved them the same way
        assert np.abs(want - init_rows(t, 0, 0, t.num_embeddings).numpy()).max() > 1e-3
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
