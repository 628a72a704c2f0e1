"""A plan executed on real gloo processes trains exactly like the unsharded model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neuroshard.kernels import fbgemm_available
from neuroshard.plan import Plan, Shard
from neuroshard.runtime.model import init_rows, train_reference
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.tables import Table

STEPS, BATCH, LR = 3, 48, 5.0
TBE = ["fbgemm_tbe"] if fbgemm_available() else []

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
    assert {plan.sharding_type(t.name) for t in TABLES} >= ({"grid_shard"} if kind == "mixed" else {kind})
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


# Every layout on the preferred kernel; the mixed plans on both (mixed on 3 devices has
# widths 2 and 3, which TBE pads to 4).
@pytest.mark.parametrize("kind,devices,kernel",
                         [(k, 2, kernel) for k in ("table_wise", "column_wise", "row_wise") for kernel in TBE]
                         + [("mixed", n, kernel) for n in (2, 3) for kernel in TBE + ["embedding_bag"]])
def test_sharded_training_matches_unsharded(kind, devices, kernel, reference):
    plan = make_plan(kind, devices)
    result = run(RunConfig(plan, list(TABLES), devices, steps=STEPS, batch_size=BATCH, lr=LR, kernel=kernel,
                           collect_weights=True, timeout_s=60))
    assert result.world_size == devices and len(result.records) == devices
    assert result.kernel == kernel and result.clock == "thread"
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    for t in TABLES:
        want = reference.weights[t.name].numpy()
        got = result.weights[t.name]
        assert not np.isnan(got).any()
        # the training moved the weights, and both sides moved them the same way
        assert np.abs(want - init_rows(t, 0, 0, t.num_embeddings).numpy()).max() > 1e-3
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_fused_embedding_reads_back_what_it_was_given_and_trains_like_embedding_bag():
    """Both kernels: initial weights read back exactly; one SGD step equals plain sparse SGD."""
    from neuroshard.kernels import FusedEmbedding
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(0)
    shapes = [(50, 8), (30, 3), (40, 8), (20, 16)]
    init = [torch.rand(r, d, generator=gen) for r, d in shapes]
    lookups = []
    for r, _ in shapes:
        lengths = torch.randint(0, 4, (6,), generator=gen)
        lookups.append((torch.randint(0, r, (int(lengths.sum()),), generator=gen),
                        torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])))
    ref = [w.clone().requires_grad_() for w in init]
    pooled = [F.embedding_bag(i, w, o, mode="sum", sparse=True) for (i, o), w in zip(lookups, ref)]
    grads = [torch.rand(p.shape, generator=gen) for p in pooled]
    torch.autograd.backward(pooled, grads)
    want = [(w - 0.5 * w.grad.to_dense()).detach() for w in ref]
    for kernel in TBE + ["embedding_bag"]:
        fused = FusedEmbedding(shapes, kernel, "cpu", lr=0.5, init=init)
        assert all(torch.equal(a, b) for a, b in zip(fused.weights(), init))
        out = fused(lookups)
        assert [tuple(o.shape) for o in out] == [(6, d) for _, d in shapes]
        for o, p in zip(out, pooled):
            torch.testing.assert_close(o, p, rtol=0, atol=1e-6)
        torch.autograd.backward(out, grads)
        fused.step()
        for got, w in zip(fused.weights(), want):
            torch.testing.assert_close(got, w, rtol=0, atol=1e-6)
