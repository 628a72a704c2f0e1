"""Memory tiers exported to TorchRec and read back (issue 29, item 6).

A plan's tables outside device memory export with their tier's kernel: host memory behind a
device cache as ``fused_uvm_caching`` (``cache_params.load_factor`` = the plan's
``cache_fraction``), host memory without a cache as ``fused_uvm``, the SSD as ``key_value``;
tables in device memory keep the export's ``compute_kernel``. Everything here is TorchRec's
real objects (``ParameterSharding``, ``CacheParams``, ``ParameterConstraints``, its own
``EmbeddingShardingPlanner``), no mocks. What is not run: ``DistributedModelParallel`` on
CPU has none of these kernels (fbgemm's UVM and SSD tables need a GPU), so no lookup goes
through them here; ``tests/test_torchrec_interop.py`` runs the layouts with the fused kernel.
"""
from __future__ import annotations

import json
import logging

import pytest

from neuroshard.cli import main
from neuroshard.errors import FormatError, NeuroShardError
from neuroshard.plan import Plan, Shard
from neuroshard.tables import Table, TableSet
from neuroshard.tiers import IN_DEVICE_MEMORY, Tier
from neuroshard.topology import make_topology
from neuroshard.torchrec.export import EXPORTER, parameter_constraints, to_parameter_shardings, torchrec_sharding
from neuroshard.torchrec.guard import torchrec_available
from neuroshard.torchrec.import_plan import plan_from_torchrec, sharding_plan_json

pytestmark = [pytest.mark.torchrec,
              pytest.mark.skipif(not torchrec_available(), reason="torchrec is not importable")]

CACHED, UVM, SSD = Tier("host", 0.2), Tier("host"), Tier("ssd", 0.1)
TABLES = TableSet("tiered", [Table("dev", 100, 16, 1.0), Table("cached", 1000, 16, 2.0),
                             Table("uvm", 200, 32, 1.0), Table("ssd", 5000, 8, 1.0)], 64)
SIZES = {t.name: (t.num_embeddings, t.embedding_dim) for t in TABLES}


def _tiered_plan(ssd_tier: Tier = SSD) -> Plan:
    """4 tables on 2 devices: one in device memory (table-wise), one in host memory behind a
    20% cache (row-wise), one in host memory without a cache (column-wise), one on SSD."""
    shards = [Shard("dev", 0, 100, 0, 16, 0),
              Shard("cached", 0, 500, 0, 16, 0, CACHED), Shard("cached", 500, 500, 0, 16, 1, CACHED),
              Shard("uvm", 0, 200, 0, 16, 1, UVM), Shard("uvm", 0, 200, 16, 16, 0, UVM),
              Shard("ssd", 0, 5000, 0, 8, 1, ssd_tier)]
    topology = make_topology(2, host_memory_bytes="1MiB", ssd_bytes="10MiB")
    return Plan(list(TABLES), shards, 2, 10**6, tables_name=TABLES.name, topology=topology).validate()


def _kernels(doc: dict) -> dict:
    return {name: (r["compute_kernel"], r.get("cache_params")) for name, r in doc["tables"].items()}


def test_tiers_export_as_their_kernels():
    plan = _tiered_plan()
    doc = json.loads(json.dumps(torchrec_sharding(plan, compute_device="cuda")))
    assert _kernels(doc) == {"dev": ("fused", None),
                             "cached": ("fused_uvm_caching", {"load_factor": 0.2, "algorithm": "LRU"}),
                             "uvm": ("fused_uvm", None),
                             "ssd": ("key_value", {"load_factor": 0.1})}  # fbgemm's SSD cache has no eviction choice
    kinds = {name: r["sharding_type"] for name, r in doc["tables"].items()}
    assert kinds == {"dev": "table_wise", "cached": "row_wise", "uvm": "column_wise", "ssd": "table_wise"}
    assert doc["tables"]["cached"]["ranks"] == [0, 1]
    assert "outside device memory: 1 fused_uvm, 1 fused_uvm_caching, 1 key_value" in EXPORTER.describe(plan, doc)
    # the global kernel is for the tables in device memory; the tiered ones keep their tier's
    lfu = torchrec_sharding(plan, compute_device="cpu", compute_kernel="fused_uvm_caching", cache_load_factor=0.5,
                            cache_algorithm="lfu")
    assert _kernels(lfu) == {"dev": ("fused_uvm_caching", {"load_factor": 0.5, "algorithm": "LFU"}),
                             "cached": ("fused_uvm_caching", {"load_factor": 0.2, "algorithm": "LFU"}),
                             "uvm": ("fused_uvm", None), "ssd": ("key_value", {"load_factor": 0.1})}
    # the cache algorithm serves the cached host table without a global caching kernel
    assert _kernels(torchrec_sharding(plan, compute_device="cpu", cache_algorithm="lfu"))["cached"] == (
        "fused_uvm_caching", {"load_factor": 0.2, "algorithm": "LFU"})
    with pytest.raises(NeuroShardError, match="for the tables in device memory .*cache_fraction"):
        torchrec_sharding(plan, compute_device="cpu", cache_load_factor=0.3)


def test_an_uncached_ssd_table_exports_with_a_warning(caplog):
    plan = _tiered_plan(Tier("ssd"))
    with caplog.at_level(logging.WARNING, logger="neuroshard.torchrec"):
        doc = torchrec_sharding(plan, compute_device="cuda")
    assert _kernels(doc)["ssd"] == ("key_value", None)
    assert "table 'ssd' is on SSD without a device cache" in caplog.text
    assert plan_from_torchrec(doc, TABLES).tiers()["ssd"] == Tier("ssd")  # and back


def test_parameter_shardings_and_constraints_are_torchrecs_own(tmp_path):
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheAlgorithm, CacheParams, KeyValueParams, ParameterSharding
    doc = torchrec_sharding(_tiered_plan(), compute_device="cuda")
    kv = KeyValueParams(ssd_storage_directory=str(tmp_path))
    shardings = to_parameter_shardings(doc, SIZES, key_value_params=kv)
    assert all(isinstance(s, ParameterSharding) for s in shardings.values())
    assert {n: s.compute_kernel for n, s in shardings.items()} == {
        "dev": "fused", "cached": "fused_uvm_caching", "uvm": "fused_uvm", "ssd": "key_value"}
    assert shardings["cached"].cache_params == CacheParams(algorithm=CacheAlgorithm.LRU, load_factor=0.2)
    assert shardings["ssd"].cache_params == CacheParams(load_factor=0.1)
    assert shardings["dev"].cache_params is None and shardings["uvm"].cache_params is None
    assert shardings["ssd"].key_value_params is kv and shardings["cached"].key_value_params is None
    assert [m.placement.rank() for m in shardings["cached"].sharding_spec.shards] == [0, 1]

    constraints = parameter_constraints(doc, key_value_params=kv)
    assert all(isinstance(c, ParameterConstraints) for c in constraints.values())
    assert {n: (c.sharding_types, c.compute_kernels) for n, c in constraints.items()} == {
        "dev": (["table_wise"], ["fused"]), "cached": (["row_wise"], ["fused_uvm_caching"]),
        "uvm": (["column_wise"], ["fused_uvm"]), "ssd": (["table_wise"], ["key_value"])}
    assert constraints["cached"].cache_params.load_factor == 0.2 and constraints["ssd"].key_value_params is kv
    bad = json.loads(json.dumps(doc))
    bad["tables"]["cached"]["cache_params"]["load_factor"] = 2
    with pytest.raises(NeuroShardError, match="table 'cached': cache_params.load_factor must be a number in"):
        to_parameter_shardings(bad)


def test_torchrecs_planner_takes_the_tiers_and_they_import_back():
    """The constraints handed to TorchRec's own planner (a cuda topology, planned on the meta
    device): it picks each table's tier kernel and cache, and its plan imports to the same tiers."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    plan = _tiered_plan()
    constraints = parameter_constraints(torchrec_sharding(plan, compute_device="cuda"))
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                                  feature_names=[f"{t.name}__feature"]) for t in TABLES]
    module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cuda"),
                                       constraints=constraints,
                                       storage_reservation=FixedPercentageStorageReservation(0.0))
    theirs = planner.plan(module, [EmbeddingBagCollectionSharder()])
    module_plan = theirs.plan[""]
    assert {n: s.compute_kernel for n, s in module_plan.items()} == {
        "dev": "fused", "cached": "fused_uvm_caching", "uvm": "fused_uvm", "ssd": "key_value"}
    assert module_plan["cached"].sharding_type == "row_wise" and module_plan["cached"].cache_params.load_factor == 0.2
    back = plan_from_torchrec(theirs, TABLES)
    assert back.tiers() == plan.tiers() and back.problems() == []


def test_tiers_round_trip_through_import(tmp_path, capsys):
    plan = _tiered_plan()
    doc = torchrec_sharding(plan, compute_device="cuda", cache_algorithm="lfu")

    def key(s):
        return (s.table, s.row_offset, s.col_offset, s.num_rows, s.num_cols, s.device, s.tier)

    # our JSON, TorchRec's objects, and TorchRec's plan as plain JSON all give the tiers back
    for source in (json.loads(json.dumps(doc)), to_parameter_shardings(doc, SIZES),
                   json.loads(json.dumps(sharding_plan_json(to_parameter_shardings(doc, SIZES))))):
        back = plan_from_torchrec(source, TABLES)
        assert back.tiers() == plan.tiers()
        assert sorted(back.shards, key=key) == sorted(plan.shards, key=key)
        # capacities default to the fullest host's use of each tier, so the plan validates
        assert back.topology.host_memory_bytes == max(plan.backing_used_bytes("host"))
        assert back.topology.ssd_bytes == max(plan.backing_used_bytes("ssd"))
    assert torchrec_sharding(back, compute_device="cuda", cache_algorithm="lfu")["tables"] == doc["tables"]
    # a caching kernel without cache_params is TorchRec's default cache (0.2); a bad load factor a FormatError
    records = json.loads(json.dumps(doc))
    del records["tables"]["cached"]["cache_params"]
    assert plan_from_torchrec(records, TABLES).tiers()["cached"] == Tier("host", 0.2)
    records["tables"]["ssd"]["cache_params"] = {"load_factor": 1.5}
    with pytest.raises(FormatError, match="table 'ssd': cache_params.load_factor"):
        plan_from_torchrec(records, TABLES)
    untiered = json.loads(json.dumps(doc))
    for record in untiered["tables"].values():
        record["compute_kernel"] = "fused"
        record.pop("cache_params", None)
    back = plan_from_torchrec(untiered, TABLES)
    assert set(back.tiers().values()) == {IN_DEVICE_MEMORY} and back.topology is None

    # the command line: export, then plan import
    path = tmp_path / "plan.json"
    plan.write(path)
    exported, imported, tables = tmp_path / "t.json", tmp_path / "back.json", TABLES.write(tmp_path / "tables.json")
    assert main(["export", str(path), "--compute-device", "cuda", "--compute-kernel", "fused_uvm_caching",
                 "-o", str(exported)]) == 0
    assert "outside device memory" in capsys.readouterr().out
    written = json.loads(exported.read_text())["tables"]
    assert written["dev"]["cache_params"] == {"load_factor": 0.2, "algorithm": "LRU"}  # the global kernel's default
    assert (written["uvm"]["compute_kernel"], written["ssd"]["compute_kernel"]) == ("fused_uvm", "key_value")
    assert main(["plan", "import", str(exported), "--format", "torchrec", "--tables", str(tables),
                 "-o", str(imported)]) == 0
    assert {n: t for n, t in Plan.read(imported).tiers().items() if n != "dev"} == {
        n: t for n, t in plan.tiers().items() if n != "dev"}
    # (the device table came back cached: it was exported with the global fused_uvm_caching)
    assert Plan.read(imported).tiers()["dev"] == Tier("host", 0.2)
    assert main(["export", str(path), "--cache-load-factor", "0.3", "-o", str(exported)]) == 2
    assert "cache_fraction" in capsys.readouterr().err
