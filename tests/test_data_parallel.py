"""Data-parallel (replicated) tables: the plan field, memory, the simulator's cost terms,
the search's decision, and training on real gloo processes equal to the unsharded model."""
from __future__ import annotations

import json

import numpy as np
import pytest

from neuroshard.costmodels import analytic_cost_models
from neuroshard.errors import FormatError, InvalidPlanError, NeuroShardError
from neuroshard.execution.kernels import fbgemm_available
from neuroshard.plan import Plan, Shard
from neuroshard.runtime.measure_plan import measure_plans
from neuroshard.runtime.model import init_rows, train_reference
from neuroshard.runtime.trainer import RunConfig, check_run, run
from neuroshard.search import search_plan
from neuroshard.search.score import score_plan
from neuroshard.search.simulator import Simulator, allreduce_ms
from neuroshard.tables import Table, TableSet
from neuroshard.torchrec.export import torchrec_sharding
from neuroshard.torchrec.import_plan import plan_from_torchrec

STEPS, BATCH, LR = 3, 48, 5.0
KERNEL = "fbgemm_tbe" if fbgemm_available() else "embedding_bag"
TABLES = [Table("t0", 300, 16, 3.0, {"zipf_alpha": 1.1}), Table("t1", 200, 8, 1.0),
          Table("t2", 250, 16, 2.0, {"zipf_alpha": 0.9}), Table("hot", 40, 8, 6.0)]


def _plan(devices: int, replicated=("hot", "t1")) -> Plan:
    """t0 row-wise over all devices, t2 table-wise, the rest replicated."""
    t0 = TABLES[0]
    cuts = np.linspace(0, t0.num_embeddings, devices + 1).astype(int)
    shards = [Shard("t0", int(a), int(b - a), 0, 16, d) for d, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
    shards.append(Shard("t2", 0, 250, 0, 16, devices - 1))
    shards += [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, 0) for t in TABLES
               if t.name not in replicated and t.name not in ("t0", "t2")]
    return Plan(list(TABLES), shards, devices, 10**6, data_parallel_tables=list(replicated)).validate()


def test_plan_round_trip_and_old_plans_unchanged(tmp_path):
    plan = _plan(2)
    path = plan.write(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["data_parallel_tables"] == ["hot", "t1"]
    again = Plan.read(path)
    assert again.data_parallel_tables == ["hot", "t1"] and again.to_dict() == plan.to_dict()
    assert again.sharding_type("hot") == "data_parallel" and again.sharding_type("t0") == "row_wise"
    assert "data-parallel tables" in again.format_summary()
    # a plan without replicated tables writes no such key
    plain = Plan([Table("a", 10, 4, 1.0)], [Shard("a", 0, 10, 0, 4, 0)], 1, 10**3)
    assert "data_parallel_tables" not in plain.to_dict()
    assert Plan.from_dict(plain.to_dict()).data_parallel_tables == []


def test_replicated_tables_take_their_full_size_on_every_device():
    plan = _plan(3)
    replicated = (40 * 8 + 200 * 8) * 4
    sharded = [sum(s.size_bytes() for s in plan.shards_on(d)) for d in range(3)]
    assert plan.memory_used_bytes() == [b + replicated for b in sharded]
    tight = Plan(plan.tables, plan.shards, 3, max(sharded) + replicated - 1, data_parallel_tables=["hot", "t1"])
    with pytest.raises(InvalidPlanError, match="device 2: shards need"):
        tight.validate()


@pytest.mark.parametrize("data,match", [
    ({"data_parallel_tables": "hot"}, "field 'data_parallel_tables' must be a list of table names"),
    ({"data_parallel_tables": [3]}, "field 'data_parallel_tables' must be a list of table names"),
])
def test_bad_field_is_refused(data, match):
    with pytest.raises(FormatError, match=match):
        Plan.from_dict({**_plan(2).to_dict(), **data}, source="p.json")


def test_listed_and_sharded_or_unknown_tables_are_refused():
    plan = _plan(2)
    both = Plan(plan.tables, plan.shards + [Shard("hot", 0, 40, 0, 8, 1)], 2, 10**6, data_parallel_tables=["hot"])
    assert any("table 'hot' is data-parallel" in p for p in both.problems())
    unknown = Plan(plan.tables, plan.shards, 2, 10**6, data_parallel_tables=["hot", "t1", "nope"])
    with pytest.raises(InvalidPlanError, match="data-parallel table 'nope' is not among"):
        unknown.validate()
    # a revision-2 reader's rule: a table without shards and not replicated is invalid
    missing = Plan(plan.tables, plan.shards, 2, 10**6, data_parallel_tables=["hot"])
    assert any("table 't1' has no shard" in p for p in missing.problems())


def _tables() -> TableSet:
    return TableSet("dp", [Table("hot", 500, 16, 60.0), Table("big", 400_000, 64, 2.0), Table("mid", 50_000, 32, 4.0),
                           Table("m2", 80_000, 32, 3.0), Table("m3", 20_000, 64, 1.0)], 4096)


def test_simulator_charges_local_compute_and_the_allreduce():
    """Per device: the sharded tables' terms as without replication, plus the replicated
    table's compute at batch B/D and a ring all-reduce of its fp32 gradient."""
    tables, models, devices = _tables(), analytic_cost_models(), 4
    plain = Simulator(tables, devices, models)
    replicated = Simulator(tables, devices, models, data_parallel_tables=["hot"])
    pieces = [p for p in replicated.memory_split(2**30)]
    assert {p.table for p in pieces} == {1, 2, 3, 4}  # the hot table is no piece
    placement = np.array([0, 1, 2, 3])[None, :]
    with_dp, without = replicated.evaluate(pieces, placement), plain.evaluate(pieces, placement)
    hot_alone = plain.single_costs_ms([plain.memory_split(2**30)[0]])[0]  # whole batch, one device
    np.testing.assert_allclose(with_dp.compute_ms, without.compute_ms + hot_alone / devices, rtol=1e-9)
    np.testing.assert_allclose(with_dp.fwd_comm_ms, without.fwd_comm_ms, rtol=1e-9)
    np.testing.assert_allclose(with_dp.bwd_comm_ms, without.bwd_comm_ms, rtol=1e-9)
    one, per_peer, per_byte = models.comm.coefs[2]
    by_hand = one + per_peer * 3 + per_byte * 2 * 3 / 4 * (500 * 16 * 4)
    np.testing.assert_allclose(with_dp.allreduce_ms, by_hand, rtol=1e-9)
    assert allreduce_ms(Simulator(tables, 1, models), 1e6) == 0.0
    np.testing.assert_allclose(with_dp.total_ms, without.total_ms + hot_alone / devices + by_hand, rtol=1e-9)
    assert without.allreduce_ms is None and "per_device_allreduce_ms" not in without.to_dict()
    assert with_dp.to_dict()["per_device_allreduce_ms"] == [round(by_hand, 6)] * devices


def test_search_replicates_a_small_hot_table_not_a_big_one():
    tables, models = _tables(), analytic_cost_models()
    never = search_plan(tables, devices=4, memory="256MiB", cost_models=models)
    assert never.data_parallel_tables == [] and "data_parallel" not in never.provenance
    assert search_plan(tables, devices=4, memory="256MiB", cost_models=models,
                       data_parallel="never").to_dict()["shards"] \
        == never.to_dict()["shards"]
    auto = search_plan(tables, devices=4, memory="256MiB", cost_models=models, data_parallel="auto")
    assert auto.data_parallel_tables == ["hot"]
    assert auto.estimate["max_device_cost_ms"] < never.estimate["max_device_cost_ms"]
    assert auto.provenance["data_parallel"]["tables"] == ["hot"]
    assert not auto.shards_of("hot") and auto.sharding_type("big") != "data_parallel"
    # memory counts the replica on every device, and a re-score reproduces the estimate
    assert score_plan(auto, tables, models).estimate["max_device_cost_ms"] == auto.estimate["max_device_cost_ms"]
    # a big table, however hot, is not replicated
    hot_big = TableSet("dp", [Table("hot", 2_000_000, 64, 60.0)] + list(_tables())[1:], 4096)
    plan = search_plan(hot_big, devices=4, memory="1GiB", cost_models=models, data_parallel="auto")
    assert plan.data_parallel_tables == []


@pytest.mark.gloo
@pytest.mark.parametrize("devices,kernel", [(2, KERNEL), (3, KERNEL), (2, "embedding_bag")])
def test_replicated_training_matches_unsharded(devices, kernel):
    """Row-wise, table-wise and replicated tables together on 2-3 gloo processes (replicas in
    fbgemm's dense TBE, or F.embedding_bag): the losses and every weight equal to the
    unsharded model's (1e-5)."""
    reference = train_reference(TABLES, STEPS, BATCH, LR)
    plan = _plan(devices)
    result = run(RunConfig(plan, list(TABLES), devices, steps=STEPS, batch_size=BATCH, lr=LR, kernel=kernel,
                           collect_weights=True, timeout_s=90))
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    for t in TABLES:
        want, got = reference.weights[t.name].numpy(), result.weights[t.name]
        assert np.abs(want - init_rows(t, 0, 0, t.num_embeddings).numpy()).max() > 1e-3  # training moved them
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert all("allreduce_ms" in r for rank in result.records for r in rank)


def test_export_and_import_keep_replicated_tables():
    plan = _plan(2)
    doc = json.loads(json.dumps(torchrec_sharding(plan, compute_device="cpu")))
    assert doc["tables"]["hot"] == {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": [0, 1]}
    assert doc["tables"]["t0"]["sharding_type"] == "row_wise"
    back = plan_from_torchrec(doc, TableSet("dp", TABLES))
    assert set(back.data_parallel_tables) == {"hot", "t1"} and set(back.shards) == set(plan.shards)
    assert back.memory_used_bytes() == plan.memory_used_bytes()


def _constrained(kinds: list[str] | None = None, devices: list[int] | None = None) -> TableSet:
    """The task with the hot table's constraints (the tables file's per-table ``constraints``)."""
    data = _tables().to_dict()
    data["tables"][0]["constraints"] = {k: v for k, v in (("sharding_types", kinds), ("devices", devices)) if v}
    return TableSet.from_dict(data)


def test_constraints_decide_whether_a_table_may_or_must_be_replicated():
    models = analytic_cost_models()
    kept = search_plan(_constrained(["table_wise", "column_wise"]), devices=4, memory="256MiB", cost_models=models,
                       data_parallel="auto")
    assert kept.data_parallel_tables == [] and kept.shards_of("hot")
    pinned = search_plan(_constrained(devices=[1]), devices=4, memory="256MiB", cost_models=models,
                         data_parallel="auto")
    assert pinned.data_parallel_tables == [] and {s.device for s in pinned.shards_of("hot")} == {1}
    forced = search_plan(_constrained(["data_parallel"]), devices=4, memory="256MiB", cost_models=models,
                         data_parallel="auto")
    assert forced.data_parallel_tables == ["hot"] and "sharded" not in forced.provenance["data_parallel"][
        "simulated_cost_ms"]
    with pytest.raises(NeuroShardError, match="table 'hot' allows only data_parallel sharding"):
        search_plan(_constrained(["data_parallel"]), devices=4, memory="256MiB", cost_models=models)


def test_the_runtime_refuses_replicated_tables_with_another_optimizer():
    plan = _plan(2)
    adam = Plan(plan.tables, plan.shards, 2, 10**6, optimizer="adam", data_parallel_tables=["hot", "t1"]).validate()
    with pytest.raises(InvalidPlanError, match="data-parallel table 'hot': the runtime trains replicated tables "
                                               "with sgd only"):
        check_run(adam, TableSet("dp", TABLES), 2)
    check_run(plan, TableSet("dp", TABLES), 2)  # sgd: accepted


def test_measure_refuses_replicated_tables_rather_than_timing_them_wrong():
    with pytest.raises(InvalidPlanError, match="data-parallel table 'hot' cannot be timed device by device"):
        measure_plans({"dp": _plan(2)}, TableSet("dp", TABLES))
