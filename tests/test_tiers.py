"""Memory tiers (issue 29, items 1, 3 and 4): tiers in plans and topologies, what each tier
holds, the analytic cost of a cached shard, and the search across tiers."""
from __future__ import annotations

import json

import pytest
from conftest import tiered_tables

from neuroshard.cli import main
from neuroshard.constants import CACHE_ROW_OVERHEAD_BYTES
from neuroshard.costmodels.tiers import TierCostModel
from neuroshard.errors import FormatError, InfeasibleError, NeuroShardError
from neuroshard.plan import Plan, Shard
from neuroshard.search.api import search_plan
from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet
from neuroshard.tiers import IN_DEVICE_MEMORY, Tier
from neuroshard.topology import Topology, make_topology, topology_from_options


# --------------------------------------------------------------- records
def test_a_tier_counts_its_cache_on_the_device_and_its_rows_behind_it():
    cached = Tier("host", 0.1)
    assert cached.cache_rows(1000) == 100 and cached.cache_rows(5) == 1  # at least one row
    assert cached.device_bytes(1000, 16, 4) == 100 * (64 + CACHE_ROW_OVERHEAD_BYTES)
    assert cached.backing_bytes(1000, 16, 4) == 1000 * 64
    assert cached.device_bytes(1000, 16, 4, "adagrad") == 100 * (128 + CACHE_ROW_OVERHEAD_BYTES)
    assert Tier("host").device_bytes(1000, 16, 4) == 0 and Tier("ssd").backing_bytes(10, 16, 4) == 640
    assert IN_DEVICE_MEMORY.device_bytes(1000, 16, 4) == 64_000 and IN_DEVICE_MEMORY.backing_bytes(1000, 16, 4) == 0


@pytest.mark.parametrize("data, message", [
    ({"memory": "gpu"}, "field 'memory' must be one of device, host, ssd"),
    ({"memory": "device", "cache_fraction": 0.5}, "no 'cache_fraction'"),
    ({"memory": "host", "cache_fraction": 0}, "in (0, 1]"),
    ({"memory": "host", "cache_fraction": 1.5}, "in (0, 1]"),
    ({"memory": "ssd", "cache_fraction": "half"}, "in (0, 1]"),
])
def test_a_bad_tier_in_a_plan_is_one_line_naming_the_shard(data, message):
    shard = {"table": "t", "row_offset": 0, "num_rows": 10, "col_offset": 0, "num_cols": 4, "device": 0, **data}
    with pytest.raises(FormatError, match="shard #3 \\(table 't'\\)") as err:
        Shard.from_dict(shard, "shard #3")
    assert message in str(err.value) and "\n" not in str(err.value)


def _plan(tiers: dict[str, Tier], topology: Topology | None, memory: int = 10**9) -> Plan:
    tables = [Table("a", 1000, 16, 1.0), Table("b", 2000, 16, 1.0)]
    shards = [Shard("a", 0, 1000, 0, 16, 0, tiers.get("a", IN_DEVICE_MEMORY)),
              Shard("b", 0, 1000, 0, 16, 1, tiers.get("b", IN_DEVICE_MEMORY)),
              Shard("b", 1000, 1000, 0, 16, 0, tiers.get("b2", tiers.get("b", IN_DEVICE_MEMORY)))]
    return Plan(tables, shards, 2, memory, topology=topology)


def test_plans_write_tiers_per_shard_and_old_plans_read_in_device_memory():
    topo = make_topology(2, host_memory_bytes="1GiB", ssd_bytes="10GiB", host_link_gbps=16)
    plan = _plan({"a": Tier("host", 0.25), "b": Tier("ssd")}, topo).validate()
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["shards"][0]["memory"] == "host" and data["shards"][0]["cache_fraction"] == 0.25
    assert data["shards"][1] == {"table": "b", "row_offset": 0, "num_rows": 1000, "col_offset": 0, "num_cols": 16,
                                 "device": 1, "memory": "ssd"}
    assert data["topology"] == {"host_memory_bytes": 2**30, "ssd_bytes": 10 * 2**30, "host_link_gbps": 16.0}
    back = Plan.from_dict(data)
    assert back.tiers() == {"a": Tier("host", 0.25), "b": Tier("ssd")} and back.topology == topo
    assert back.memory_used_bytes() == [250 * (64 + CACHE_ROW_OVERHEAD_BYTES), 0]
    assert back.backing_used_bytes("host") == [64_000] and back.backing_used_bytes("ssd") == [128_000]
    assert "host+cache 25%" in back.format_summary() and "SSD used per host" in back.format_summary()
    old = _plan({}, None)
    assert all(set(s) == {"table", "row_offset", "num_rows", "col_offset", "num_cols", "device"}
               for s in old.to_dict()["shards"]) and not old.tiered


def test_plan_validate_checks_every_tier():
    assert any("different memory tiers" in p for p in
               _plan({"b": Tier("host", 0.5), "b2": IN_DEVICE_MEMORY}, None).problems())
    assert any("states no host memory" in p and "--host-memory" in p for p in
               _plan({"a": Tier("host", 0.5)}, None).problems())
    small = make_topology(2, host_memory_bytes=1000, ssd_bytes=10**6)
    problems = _plan({"a": Tier("host", 0.5), "b": Tier("ssd", 0.1)}, small).problems()
    assert problems == ["host 0: shards keep 64000 bytes in host memory, over its 1000 by 63000"]
    assert _plan({"a": Tier("host", 0.5)}, make_topology(2, host_memory_bytes="1GiB"), memory=20_000).problems() \
        == ["device 0: shards need 104000 bytes, over its 20000 by 84000",  # b's device half + a's cache
            "device 1: shards need 64000 bytes, over its 20000 by 44000"]


def test_topology_tiers_from_files_and_flags():
    topo = Topology.from_dict({"num_devices": 16, "local_world_size": 8, "host_memory_bytes": "2TiB",
                               "ssd_bytes": "30TB", "ssd_gbps": 12, "ssd_iops": 2e6})
    assert topo.tier_host_of().tolist() == [0] * 8 + [1] * 8
    assert topo.tier_links() == {"host_link_gbps": 32.0, "ssd_gbps": 12.0, "ssd_iops": 2e6}
    assert "host memory 2.0 TiB and SSD" in topo.describe()
    flagged = topology_from_options(None, 4, None, None, None, {"host_memory_bytes": 2**30, "ssd_bytes": None})
    assert flagged.host_memory_bytes == 2**30 and not flagged.hosts_stated  # tiers do not state hosts
    assert topology_from_options(None, 4, None, None, None, {"host_memory_bytes": None}) is None
    for bad, field in (({"host_memory_bytes": -1}, "host_memory_bytes"), ({"ssd_iops": 0}, "ssd_iops"),
                       ({"host_link_gbps": "fast"}, "host_link_gbps")):
        with pytest.raises(FormatError, match=f"field '{field}'"):
            Topology.from_dict({"num_devices": 2, **bad}, source="topo.json")


# ------------------------------------------------------------------ costs
def test_a_cached_shard_costs_less_the_larger_its_cache_and_ssd_costs_more(analytic_models):
    tables = tiered_tables(3)
    model = TierCostModel(None, 4, tables.batch_size, 4)
    t = tables[0]
    costs = [model.shard_ms(t, Tier("host", f), t.num_embeddings, t.embedding_dim) for f in (0.01, 0.1, 0.5)]
    assert costs[0] > costs[1] > costs[2] > 0
    assert model.shard_ms(t, Tier("host"), t.num_embeddings, t.embedding_dim) > costs[0]
    assert model.shard_ms(t, Tier("ssd", 0.1), t.num_embeddings, t.embedding_dim) > costs[1]
    assert model.shard_ms(t, IN_DEVICE_MEMORY, t.num_embeddings, t.embedding_dim) == 0.0
    # a row block carries its share of the unique rows
    half = model.shard_ms(t, Tier("host", 0.1), t.num_embeddings // 2, t.embedding_dim)
    assert half == pytest.approx(costs[1] / 2, rel=1e-6)
    # a faster host link: cheaper misses
    fast = TierCostModel(make_topology(4, host_link_gbps=64), 4, tables.batch_size, 4)
    assert fast.shard_ms(t, Tier("host", 0.1), t.num_embeddings, t.embedding_dim) == pytest.approx(costs[1] / 2)


# ----------------------------------------------------------------- search
def test_tables_three_times_the_devices_memory_plan_with_cached_shards(analytic_models):
    tables = tiered_tables()
    memory = tables.total_bytes() // 12  # 4 devices hold a third of the tables
    with pytest.raises(InfeasibleError, match="--host-memory"):
        search_plan(tables, 4, memory, "size-lookup", cost_models=analytic_models)
    topo = make_topology(4, host_memory_bytes=2 * tables.total_bytes())
    for algorithm in ("neuroshard", "size-lookup"):
        plan = search_plan(tables, 4, memory, algorithm, cost_models=analytic_models, topology=topo)
        assert not plan.problems() and plan.tiered
        assert max(plan.memory_used_bytes()) <= memory
        assert sum(plan.backing_used_bytes("host")) > 0
        record = plan.provenance["tiers"]
        assert record["model"].startswith("analytic") and sum(record["tables"].values()) == len(tables)
        # the plan's estimate is what scoring the plan file gives (tiers read back from the shards)
        again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
        sim = Simulator.from_plan(again, analytic_models, batch_size=again.estimate["batch_size"])
        assert float(sim.evaluate_plan(again).max_ms[0]) == pytest.approx(plan.estimate["max_device_cost_ms"],
                                                                        rel=1e-6)
    # tables that fit stay in device memory, topology or not
    roomy = search_plan(tables, 4, tables.total_bytes(), "size-lookup", cost_models=analytic_models, topology=topo)
    assert not roomy.tiered and "tiers" not in roomy.provenance


def test_the_cheapest_tables_leave_device_memory_first(analytic_models):
    """Under a tight budget the caches go where they save most: a hot table keeps a larger
    share on the device than an equally large cold one."""
    hot = Table("hot", 400_000, 32, 20.0, {"zipf_alpha": 1.2})
    cold = Table("cold", 400_000, 32, 1.0, {"zipf_alpha": 1.2})
    tables = TableSet("two", [hot, cold], batch_size=4096)
    topo = make_topology(2, host_memory_bytes=tables.total_bytes())
    plan = search_plan(tables, 2, tables.total_bytes() // 6, "size-lookup", cost_models=analytic_models, topology=topo)
    tiers = plan.tiers()
    share = {name: (1.0 if t.on_device else t.cache_fraction or 0.0) for name, t in tiers.items()}
    assert share["hot"] > share["cold"]


def test_ssd_takes_what_host_memory_cannot(analytic_models):
    tables = tiered_tables()
    total = tables.total_bytes()
    topo = make_topology(4, host_memory_bytes=total // 3, ssd_bytes=total * 2)
    plan = search_plan(tables, 4, total // 12, "size-lookup", cost_models=analytic_models, topology=topo)
    assert not plan.problems()
    memories = {t.memory for t in plan.tiers().values()}
    assert {"host", "ssd"} <= memories
    assert sum(plan.backing_used_bytes("host")) <= total // 3
    with pytest.raises(InfeasibleError, match="hold less"):
        search_plan(tables, 4, total // 12, "size-lookup", cost_models=analytic_models,
                    topology=make_topology(4, host_memory_bytes=total // 10))


def test_search_cli_takes_tier_flags_and_plan_show_reports_tiers(tmp_path, capsys, analytic_models):
    tables = tiered_tables(6)
    path = tmp_path / "t.json"
    tables.write(path)
    memory = tables.total_bytes() // 8
    out = tmp_path / "p.json"
    code = main(["search", str(path), "-d", "2", "-m", str(memory), "-a", "size-lookup", "--host-memory",
                 str(2 * tables.total_bytes()), "--host-link-gbps", "25", "-o", str(out)])
    assert code == 0
    text = capsys.readouterr()
    assert "memory tiers (tables outside device memory)" in text.out + text.err
    plan = Plan.read(out)
    assert plan.tiered and plan.topology.host_link_gbps == 25.0
    assert main(["plan", "validate", str(out)]) == 0
    with pytest.raises(NeuroShardError):
        topology_from_options(None, 2, None, None, None, {"bogus": 1})


# --------------------------------------------------------------- capacity
def test_capacity_finds_fewer_devices_with_tiers_within_the_slowdown(tmp_path, analytic_models, capsys):
    from neuroshard.search.capacity import plan_capacity
    tables = tiered_tables()
    memory = tables.total_bytes() // 12
    report = plan_capacity(tables, memory, 2, host_memory=2 * tables.total_bytes(), slowdown=1.5,
                           algorithm="size-lookup", cost_models=analytic_models)
    flat, tiered = report.device_memory_only, report.tiered
    assert flat["devices"] % 2 == 0 and flat["devices"] * memory * 0.85 >= tables.total_bytes()
    assert tiered["devices"] <= flat["devices"] and tiered["cost_ms"] <= 1.5 * flat["cost_ms"] + 1e-9
    assert report.plan is not None and not report.plan.problems()
    assert any(t["tiered"] for t in report.tried) and any(not t["tiered"] for t in report.tried)
    with pytest.raises(NeuroShardError, match="--host-memory"):
        plan_capacity(tables, memory, 2, cost_models=analytic_models)
    # the command writes the report and the tiered plan beside it
    path = tmp_path / "t.json"
    tables.write(path)
    out = tmp_path / "cap.json"
    assert main(["capacity", str(path), "-m", str(memory), "--host-memory", str(2 * tables.total_bytes()),
                 "--local-world-size", "2", "-a", "size-lookup", "--slowdown", "1.5", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data) >= {"device_memory_only", "tiered", "tiered_plan"}
    assert Plan.read(data["tiered_plan"]).num_devices == data["tiered"]["devices"]
    assert "all rows in device memory" in capsys.readouterr().out
