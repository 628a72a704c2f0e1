"""A plan that validates does not run out of memory: the runtime measures the embedding
storage each rank holds (weights, optimizer state, caches and their bookkeeping, summed
over the storages of the tensors it keeps) and the plan's estimate for that rank
(``Plan.memory_used_bytes``) is within 10% above it, never below, on plans with a per-weight
optimizer state (adagrad on CPU, adam on CUDA: fbgemm-gpu-cpu's TBE has no adam), fp16
weights, cached tables and row splits, trained on 2 gloo ranks."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import run_cli

import neuroshard
from neuroshard.costmodels import analytic_cost_models
from neuroshard.plan import Plan
from neuroshard.runtime.memory import KERNEL_METADATA_BYTES, format_memory
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.tables import Table, TableSet
from neuroshard.tiers import Tier
from neuroshard.topology import Topology

DEVICES, BATCH = 2, 256
TABLES = TableSet("held", [Table("t0", 60_000, 64, 3.0, {"zipf_alpha": 1.0}),
                           Table("t1", 30_000, 32, 2.0, {"zipf_alpha": 0.9}),
                           Table("t2", 80_000, 128, 1.5, {"zipf_alpha": 1.1}),
                           Table("t3", 20_000, 16, 4.0),
                           Table("t4", 50_000, 64, 2.0, {"zipf_alpha": 1.2})], batch_size=BATCH)
#: the state-keeping optimizer trained here: fbgemm's TBE runs adam on CUDA only
STATEFUL = "adam" if torch.cuda.is_available() else "adagrad"


def _search(memory: str, **options) -> Plan:
    return neuroshard.shard(TABLES, devices=DEVICES, memory=memory, cost_models=analytic_cost_models(), **options)


def _cached(plan: Plan) -> Plan:
    """``plan`` with t0 in host memory behind a 25% cache, t3 in host memory with a 50% cache
    and t1 in host memory without one (the runtime trains cached shards with sgd)."""
    tiers = {"t0": Tier("host", 0.25), "t3": Tier("host", 0.5), "t1": Tier("host")}
    shards = [dataclasses.replace(s, tier=tiers.get(s.table, s.tier)) for s in plan.shards]
    return dataclasses.replace(plan, shards=shards, topology=Topology(DEVICES, host_memory_bytes=2**30)).validate()


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    out = {
        # fp16 weights with a per-weight state (fp32 in fbgemm, whatever the weights' precision)
        f"{STATEFUL}-fp16": _search("96MiB", bytes_per_element=2, optimizer=STATEFUL),
        # t2 (80k x 128, 39 MiB with its row-wise state) fits no device whole: split along rows (no
        # split for balance: the analytic models would cut it into column strips, which fit whole)
        "rowwise-adagrad-rows": _search("38MiB", optimizer="rowwise-adagrad", split_margin=0.99),
        "cached-fp16": _cached(_search("32MiB", bytes_per_element=2)),
    }
    assert out["rowwise-adagrad-rows"].sharding_type("t2") in ("row_wise", "table_row_wise", "grid_shard")
    return out


@pytest.mark.gloo
def test_each_rank_holds_at_most_its_estimate_and_within_10_percent(plans):
    names = list(plans)
    result = run(RunConfig(plans[names[0]], list(TABLES), DEVICES, steps=2 * len(names), batch_size=BATCH,
                           alternates=[plans[n] for n in names[1:]], turn=2, timeout_s=120))
    print(format_memory(result.memory))
    assert {(m.plan, m.rank) for m in result.memory} == {(p, r) for p in range(len(names)) for r in range(DEVICES)}
    for m in result.memory:
        plan = plans[names[m.plan]]
        assert m.estimate_bytes == plan.memory_used_bytes()[m.rank] > 0
        counted = m.device_bytes - m.uncounted_bytes  # the kernels' metadata, a cache's excess slots: reported
        assert m.device_bytes - m.excess_slot_bytes - m.estimate_bytes <= KERNEL_METADATA_BYTES * m.kernels, (
            names[m.plan], m)
        assert m.estimate_bytes <= 1.10 * counted, (names[m.plan], m)
        assert m.process_peak_bytes > m.device_bytes
        assert m.process_peak == ("CUDA allocator peak" if torch.cuda.is_available() else "process peak RSS")
    cached = [m for m in result.memory if names[m.plan] == "cached-fp16"]
    for m in cached:  # the backing stores in host memory: what the plan counts for them
        assert m.backing_bytes.get("host", 0) == m.backing_estimate_bytes.get("host", 0)
    assert sum(m.backing_bytes.get("host", 0) for m in cached) > 0 and sum(m.cache_index_bytes for m in cached) > 0
    # t1 has no cache: the runtime's one slot for it (and a batch's rows) is beyond any capacity
    assert sum(m.excess_slot_bytes for m in cached) > 0


@pytest.mark.gloo
def test_train_prints_each_ranks_memory_beside_its_estimate(runtime_tables, runtime_plan, tmp_path):
    plan = runtime_plan("mixed", 2)
    plan.write(tmp_path / "plan.json")
    TableSet("runtime", runtime_tables, 64).write(tmp_path / "tables.json")
    done = run_cli("train", "--plan", tmp_path / "plan.json", "--tables", tmp_path / "tables.json", "--steps", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("embedding memory per rank"))
    for rank, used in enumerate(plan.memory_used_bytes()):
        line = lines[at + 1 + rank]
        assert line.startswith(f"  rank {rank}: estimate {used:,} B, held ") and "process peak RSS" in line
