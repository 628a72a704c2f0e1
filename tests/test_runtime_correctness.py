"""A plan executed on real gloo processes trains exactly like the unsharded model (the
tables and plans: conftest's ``runtime_tables`` and ``runtime_plan``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neuroshard.execution.kernels import FusedEmbedding, fbgemm_available
from neuroshard.runtime.model import init_rows, train_reference
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.tables import Table

STEPS, BATCH, LR = 3, 48, 5.0
TBE = ["fbgemm_tbe"] if fbgemm_available() else []


@pytest.fixture(scope="module")
def reference(runtime_tables):
    return train_reference(runtime_tables, STEPS, BATCH, LR)


def test_init_rows_is_the_same_whatever_the_slicing():
    t = Table("big", 10_000, 12, 1.0)
    full = init_rows(t, 7, 0, t.num_embeddings)
    part = init_rows(t, 7, 4000, 300, col_start=4, num_cols=8)
    assert torch.equal(part, full[4000:4300, 4:12])
    assert not torch.equal(init_rows(t, 8, 0, 10), full[:10])


# Every layout on the preferred kernel; the mixed plans on both (mixed on 3 devices has
# widths 2 and 3, which TBE pads to 4).
@pytest.mark.gloo
@pytest.mark.parametrize("kind,devices,kernel",
                         [(k, 2, kernel) for k in ("table_wise", "column_wise", "row_wise") for kernel in TBE]
                         + [("mixed", n, kernel) for n in (2, 3) for kernel in TBE + ["embedding_bag"]])
def test_sharded_training_matches_unsharded(kind, devices, kernel, reference, runtime_tables, runtime_plan):
    plan = runtime_plan(kind, devices)
    result = run(RunConfig(plan, runtime_tables, devices, steps=STEPS, batch_size=BATCH, lr=LR, kernel=kernel,
                           collect_weights=True, timeout_s=60))
    assert result.world_size == devices and len(result.records) == devices
    assert result.kernel == kernel and result.clock == "thread"
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    for t in runtime_tables:
        want = reference.weights[t.name].numpy()
        got = result.weights[t.name]
        assert not np.isnan(got).any()
        # the training moved the weights, and both sides moved them the same way
        assert np.abs(want - init_rows(t, 0, 0, t.num_embeddings).numpy()).max() > 1e-3
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_fused_embedding_reads_back_what_it_was_given_and_trains_like_embedding_bag():
    """Both kernels: initial weights read back exactly; one SGD step equals plain sparse SGD."""
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
