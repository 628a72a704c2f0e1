"""Kernel benchmark: real fbgemm TBE and EmbeddingBag kernels on small shard sets."""
import numpy as np
import pytest
import torch

from neuroshard.costmodels.samples.kernel import KernelBenchmark, fbgemm_available
from neuroshard.errors import NeuroShardError
from neuroshard.tables import Table

KERNELS = ["embedding_bag"] + (["fbgemm_tbe"] if fbgemm_available() else [])


def _bench(kernel, **kw):
    return KernelBenchmark(kernel=kernel, batch_size=1024, flush_bytes=16 << 20, warmup=1, repeats=5,
                           max_repeats=7, **kw)


def _mean_costs(bench, sets, passes=3):
    """Interleaved passes so machine noise hits every set alike."""
    costs = np.zeros(len(sets))
    for _ in range(passes):
        for i, shards in enumerate(sets):
            costs[i] += bench.measure(shards).cost_ms / passes
    return costs


@pytest.mark.timing
@pytest.mark.parametrize("kernel", KERNELS)
def test_costs_positive_and_grow_with_pooling_and_width(kernel):
    bench = _bench(kernel)
    low_pf = [Table("a", 20000, 32, 2.0, {"zipf_alpha": 0.5})]
    high_pf = [Table("a", 20000, 32, 32.0, {"zipf_alpha": 0.5})]
    narrow = [Table("b", 20000, 8, 16.0)]
    # 32x the width: 16x measured 1.48-1.7x with embedding_bag on an AMD EPYC (a flaky 1.5x bound), 32x 2.5-2.8x
    wide = [Table("b", 20000, 256, 16.0)]
    costs = _mean_costs(bench, [low_pf, high_pf, narrow, wide])
    assert (costs > 0).all()
    assert costs[1] > 1.5 * costs[0], costs
    assert costs[3] > 1.5 * costs[2], costs


@pytest.mark.timing
@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_set_of_mixed_widths(kernel):
    shards = [Table("x", 5000, 16, 4.0), Table("y", 300, 64, 1.0, {"zipf_alpha": 1.1}),
              Table("z", 5000, 16, 0.0), Table("w", 2_000_000, 32, 3.0)]  # empty shard, folded huge shard
    before = torch.get_num_threads()
    m = _bench(kernel, max_rows=10_000).measure(shards)
    assert torch.get_num_threads() == before  # restored
    assert m.kernel == kernel and m.batch_size == 1024
    assert m.cost_ms > m.fwd_ms > 0 and len(m.times_ms) >= 5 and m.cv >= 0
    assert m.cost_ms == pytest.approx(float(np.median(m.times_ms)), rel=1e-3)


def test_auto_picks_fbgemm_when_importable():
    assert KernelBenchmark(kernel="auto").kernel == ("fbgemm_tbe" if fbgemm_available() else "embedding_bag")


@pytest.mark.parametrize("kwargs, message", [
    ({"kernel": "cublas"}, "unknown kernel"),
    ({"backend": "tpu"}, "unknown backend"),
    ({"optimizer": "adam"}, "unknown optimizer"),
    ({"clock": "sundial"}, "unknown clock"),
    ({"batch_size": 0}, "batch_size"),
])
def test_bad_configuration(kwargs, message):
    with pytest.raises(NeuroShardError, match=message):
        KernelBenchmark(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU")
def test_cuda_without_gpu():
    with pytest.raises(NeuroShardError, match="cuda|CUDA"):
        KernelBenchmark(backend="cuda", kernel="embedding_bag")


def test_over_memory_cap_and_empty_set():
    bench = _bench("auto", memory_bytes=1 << 20)
    with pytest.raises(NeuroShardError, match="over the device memory cap"):
        bench.measure([Table("big", 10000, 64, 1.0)])  # 2.4 MiB > 1 MiB
    with pytest.raises(NeuroShardError, match="at least one shard"):
        bench.measure([])


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_dropped_kernel_frees_its_weights_at_once(kernel):
    """``measure`` on CUDA drops each device's kernel after its turn: its weights must go with
    the last reference, not wait for the garbage collector (a kernel that referred back to its
    owner made a cycle, and an H200 ran out of memory with the devices of 7 plans held)."""
    import gc
    import weakref

    from neuroshard.execution.kernels import FusedEmbedding

    FusedEmbedding([(100, 8)], kernel=kernel)  # first-use imports out of the way
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        refs = []
        for _ in range(3):
            fused = FusedEmbedding([(1000, 16), (500, 32)], kernel=kernel)
            refs.append((weakref.ref(fused), weakref.ref(fused.impl)))
            del fused
        assert all(f() is None and k() is None for f, k in refs)
    finally:
        if was_enabled:
            gc.enable()


def test_same_cpu_tells_cpus_of_one_name_apart_by_their_cache():
    """Cloud VMs name different Xeons alike: a checkpoint measured under this CPU's name but
    with another cache flush (another last-level cache) is not this CPU's (the demo then
    calibrates)."""
    from neuroshard.costmodels.samples.kernel import cache_flush_bytes
    from neuroshard.costmodels.samples.store import cpu_model, same_cpu
    here = {"hardware": {"cpu_model": cpu_model()}, "config": {"backend": "cpu", "flush_bytes": cache_flush_bytes()}}
    assert same_cpu(here)
    assert not same_cpu({**here, "config": {"backend": "cpu", "flush_bytes": cache_flush_bytes() + 4096}})
    assert not same_cpu({"hardware": {"cpu_model": "another CPU"}, "config": here["config"]})
    assert same_cpu({"hardware": {"cpu_model": cpu_model()}})  # a record without a flush: the name decides
