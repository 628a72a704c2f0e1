"""Cached shards (rows in host memory or on SSD, a bounded device cache) train exactly like
shards in device memory, on real gloo processes; the miss rates the runtime measures are the
ones ``cache_model.replay_miss_rates`` replays from the same batches; ``neuroshard evaluate``
reports them (the tables: conftest's ``runtime_tables``)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import _runtime_plan, run_cli

from neuroshard.datasets.cache_model import replay_miss_rates
from neuroshard.errors import InvalidPlanError, NeuroShardError
from neuroshard.execution.kernels import local_lookups
from neuroshard.plan import Plan, Shard
from neuroshard.runtime.cached import BackingStore, CachedShard
from neuroshard.runtime.model import make_batch, train_reference
from neuroshard.runtime.trainer import RunConfig, check_run, run
from neuroshard.tables import Table, TableSet
from neuroshard.tiers import Tier
from neuroshard.topology import Topology

STEPS, BATCH, LR = 12, 48, 5.0
# t0 (rows and columns split over both ranks) in host memory with a 5% cache, t1 (columns)
# in host memory without a cache, t2 (rows, both ranks) on SSD with 10%, t3 (whole, rank 1)
# in host memory with 50%; t4 (whole, rank 0) in device memory: rank 0 runs the fused kernel
# beside its caches, rank 1 has caches only.
TIERS = {"t0": Tier("host", 0.05), "t1": Tier("host"), "t2": Tier("ssd", 0.1), "t3": Tier("host", 0.5)}
TIERED_TOPOLOGY = Topology(2, host_memory_bytes=10**9, ssd_bytes=10**9)


def tiered(plan: Plan, tiers: dict[str, Tier] = TIERS, **changes) -> Plan:
    shards = [dataclasses.replace(s, tier=tiers.get(s.table, s.tier)) for s in plan.shards]
    return dataclasses.replace(plan, shards=shards, topology=TIERED_TOPOLOGY, **changes).validate()


@pytest.fixture(scope="module")
def reference(runtime_tables):
    return train_reference(runtime_tables, STEPS, BATCH, LR)


@pytest.fixture(scope="module")
def tiered_run(runtime_tables, tmp_path_factory):
    """The mixed 2-device plan with ``TIERS``, trained on 2 gloo processes (their temporary
    folder a fresh one: the SSD files must be gone afterwards)."""
    plan = tiered(_runtime_plan("mixed", 2))
    tmp = tmp_path_factory.mktemp("tmpdir")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    try:
        result = run(RunConfig(plan, runtime_tables, 2, steps=STEPS, batch_size=BATCH, lr=LR, collect_weights=True,
                               timeout_s=60))
    finally:
        if old is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = old
    return plan, result, tmp


@pytest.mark.gloo
def test_cached_training_matches_uncached(tiered_run, reference, runtime_tables, runtime_plan):
    _, result, tmp = tiered_run
    device = run(RunConfig(runtime_plan("mixed", 2), runtime_tables, 2, steps=STEPS, batch_size=BATCH, lr=LR,
                           collect_weights=True, timeout_s=60))
    assert device.cache == {}
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    np.testing.assert_allclose(result.losses, device.losses, rtol=0, atol=1e-5)
    for t in runtime_tables:
        got = result.weights[t.name]
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, reference.weights[t.name].numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(got, device.weights[t.name], rtol=0, atol=1e-5)
    assert not list(tmp.glob("neuroshard-ssd-*"))  # the SSD backing files were removed
    # the caches were used: misses and hits, every step's miss path timed on every rank with caches
    assert set(result.cache) == set(TIERS)
    assert 0 < result.cache["t0"]["miss_rate"] < 1 and 0 < result.cache["t3"]["miss_rate"] < 1
    assert result.cache["t1"]["miss_rate"] == 1.0  # no cache: every row loaded
    for records in result.records:
        assert all(r["cache_ms"] > 0 for r in records)


def _stream(table: Table, shard: Shard, rows: int) -> list[np.ndarray]:
    """The batches the runtime drew, as one shard's local row ids."""
    out = []
    for step in range(STEPS):
        ids, lengths = make_batch([table], BATCH, step, 0).lookups[table.name]
        out.append(local_lookups(ids, lengths, shard.row_offset, shard.num_rows, table.num_embeddings, rows)[0].numpy())
    return out


@pytest.mark.gloo
def test_measured_miss_rate_is_the_replayed_one(tiered_run, runtime_tables):
    """Per table, the runtime's unique rows are the replay's exactly; its misses are the replay's
    up to the cache's edge, where the runtime breaks a tie among one batch's rows by a random
    draw and the replay counts the expectation over that draw."""
    plan, result, _ = tiered_run
    tables = {t.name: t for t in runtime_tables}
    for name, measured in result.cache.items():
        unique = misses = 0.0
        for s in plan.shards_of(name):
            stream = _stream(tables[name], s, s.num_rows)
            capacity = s.tier.cache_rows(s.num_rows)
            per_batch, (rate,) = replay_miss_rates(stream, s.num_rows, [max(capacity, 1) / s.num_rows])
            batches = STEPS - STEPS // 2
            unique += per_batch * batches
            misses += (rate if capacity else 1.0) * per_batch * batches
        assert measured["steps"] == STEPS - STEPS // 2
        assert measured["lookups_unique"] == round(unique)
        assert abs(measured["misses"] - misses) <= 0.03 * unique + 1, (name, measured, misses)


def _cached_shard(rows: int, fraction: float | None, memory: str = "host", seed: int = 0) -> CachedShard:
    table = Table("c", rows, 4, 1.0)
    shard = Shard("c", 0, rows, 0, 4, 0, Tier(memory, fraction))
    return CachedShard(shard, table, rows, 0, torch.device("cpu"), torch.float32, np.random.default_rng(seed))


def _replay_on(cs: CachedShard, stream: list[np.ndarray]) -> float:
    """The shard's measured miss rate over the second half of ``stream``."""
    unique = misses = 0
    for b, ids in enumerate(stream):
        _, u, m, _ = cs.prepare(torch.from_numpy(ids))
        if b >= len(stream) // 2:
            unique, misses = unique + u, misses + m
    return misses / unique


def test_lru_without_ties_at_the_edge_is_the_replay_exactly():
    """Batches that each use one whole block of 8 rows (blocks drawn skewed) and caches of whole
    blocks: no tie at the cache's edge, so the runtime's LRU and the replay agree exactly."""
    rng = np.random.default_rng(1)
    blocks = np.minimum(rng.zipf(1.3, 400) - 1, 49)
    stream = [rng.permutation(np.repeat(np.arange(8 * b, 8 * b + 8), 2)) for b in blocks]
    for fraction in (0.04, 0.16, 0.5, 1.0):  # 2, 8 and 25 blocks of the 50, and all
        measured = _replay_on(_cached_shard(400, fraction), stream)
        _, (replayed,) = replay_miss_rates(stream, 400, [fraction])
        assert 0 < measured < 1
        assert measured == pytest.approx(replayed, abs=1e-12), fraction


def test_lru_with_ties_agrees_with_the_replay_in_expectation():
    """Skewed batches of 24 lookups over 500 rows: the replay's expected miss rate, and the
    runtime's (random ties at the edge) within the spread of that draw."""
    rng = np.random.default_rng(2)
    stream = [np.minimum(rng.zipf(1.2, 24) - 1, 499) for _ in range(300)]
    for fraction in (0.05, 0.1, 0.5):
        capacity = Tier("host", fraction).cache_rows(500)
        _, (replayed,) = replay_miss_rates(stream, 500, [capacity / 500])
        measured = _replay_on(_cached_shard(500, fraction, seed=3), stream)
        assert measured == pytest.approx(replayed, abs=0.01), fraction


def test_a_cache_writes_back_and_reads_back_every_row():
    """Rows pass through a tiny cache (one slot) of an SSD store and a host store without a cache;
    the weights read back are the backing store's with the cache over it, every update kept."""
    for memory, fraction in (("ssd", 0.01), ("host", None)):
        cs = _cached_shard(60, fraction, memory)
        folder = cs.backing.folder
        want = cs.weights().copy()
        rng = np.random.default_rng(0)
        for _ in range(20):
            ids = rng.integers(0, 60, 7)
            slots, unique, misses, _ = cs.prepare(torch.from_numpy(ids))
            assert unique == len(set(ids.tolist())) and 0 <= misses <= unique
            out = torch.nn.functional.embedding_bag(slots, cs.slots, torch.tensor([0, 3]), mode="sum", sparse=True)
            out.sum().backward()
            cs.step(0.5)
            np.subtract.at(want, ids, 0.5)  # each lookup's gradient is one
        np.testing.assert_allclose(cs.weights(), want, rtol=0, atol=1e-6)
        cs.close()
        if memory == "ssd":
            assert not Path(folder).exists()


def test_backing_store_refuses_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "missing"))
    with pytest.raises(NeuroShardError) as err:
        BackingStore("ssd", 10, 4, torch.float32, "table 'x'")
    assert "cannot create its SSD backing file" in str(err.value) and "\n" not in str(err.value)


def test_cached_shards_train_with_sgd_only(runtime_tables, runtime_plan):
    plan = tiered(runtime_plan("mixed", 2), optimizer="adagrad")
    with pytest.raises(InvalidPlanError, match="trains such shards with sgd only"):
        check_run(plan, TableSet("tables", runtime_tables), 2)


@pytest.mark.gloo
def test_evaluate_reports_the_caches(tmp_path, runtime_tables, runtime_plan):
    TableSet("tables", runtime_tables, BATCH).write(tmp_path / "tables.json")
    tiered(runtime_plan("mixed", 2)).write(tmp_path / "plan.json")
    out = run_cli("evaluate", "--plan", "plan.json", "--tables", "tables.json", "--iterations", "4", "--warmup", "1",
                  "--json", "m.json", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "cached tables (LRU" in out.stdout and "measured on this CPU" in out.stdout
    assert "t2  ssd+cache 10%" in out.stdout
    m = json.loads((tmp_path / "m.json").read_text())
    assert set(m["cache"]) == set(TIERS)
    for c in m["cache"].values():
        assert c["steps"] == 3 and c["lookups_unique"] >= c["misses"] > 0
        assert c["miss_rate"] == c["misses"] / c["lookups_unique"] and c["miss_path_ms_per_step"] > 0
    # a plan the runtime cannot train with caches: one line, no traceback
    tiered(runtime_plan("mixed", 2), optimizer="adagrad").write(tmp_path / "adagrad.json")
    out = run_cli("train", "--plan", "adagrad.json", "--tables", "tables.json", cwd=tmp_path, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "sgd only" in out.stderr and len(out.stderr.strip().splitlines()) == 1
