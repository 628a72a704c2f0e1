"""The way in from TorchRec: a plan TorchRec made is imported, validated, scored and
exported again with identical shards; `plan show` knows our export; re-scoring a plan
uses the batch size its estimate was made for."""
from __future__ import annotations

import json

import pytest
from conftest import run_cli

from neuroshard.costmodels import analytic_cost_models
from neuroshard.errors import FormatError, InvalidPlanError
from neuroshard.plan import Plan
from neuroshard.search import search_plan
from neuroshard.search.score import score_plan
from neuroshard.tables import Table, TableSet
from neuroshard.torchrec.export import torchrec_sharding
from neuroshard.torchrec.import_plan import plan_from_torchrec, record_of, sharding_plan_json

TABLES = TableSet("roundtrip", [Table("a", 100, 16, 2.0), Table("b", 57, 32, 1.0), Table("c", 1001, 16, 3.0),
                                Table("d", 403, 8, 1.5), Table("e", 999, 256, 4.0, {"zipf_alpha": 1.1})], 1024)


def _torchrec_plan():
    """What TorchRec's sharding helpers make for 4 ranks on 2 hosts: one table of each type."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchrec.distributed.planner")
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        grid_shard,
        row_wise,
        table_row_wise,
        table_wise,
    )
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim,
                                                            num_embeddings=t.num_embeddings,
                                                            feature_names=[f"f_{t.name}"]) for t in TABLES],
                                 device=torch.device("meta"))
    return construct_module_sharding_plan(
        ebc, {"a": table_wise(rank=3), "b": column_wise(ranks=[2, 0]), "c": row_wise(),
              "d": table_row_wise(host_index=1), "e": grid_shard(host_indexes=[0, 1])},
        local_size=2, world_size=4, device_type="cuda")


def _shards(records: dict) -> dict:
    return {name: (r["sharding_type"], [(tuple(s["shard_offsets"]), tuple(s["shard_sizes"]), s["placement"])
                                        for s in sorted(r["sharding_spec"], key=lambda s: s["shard_offsets"][::-1])])
            for name, r in records.items()}


@pytest.mark.torchrec
def test_a_torchrec_plan_round_trips_with_identical_shards(tmp_path):
    module_plan = _torchrec_plan()
    original = {name: record_of(sharding) for name, sharding in module_plan.items()}
    from torchrec.distributed.types import ShardingPlan
    assert sharding_plan_json(ShardingPlan({"sparse.ebc": module_plan})) == {"sparse.ebc": original}
    # The Python way in: TorchRec's objects.
    plan = plan_from_torchrec(module_plan, TABLES, num_devices=4)
    assert {plan.sharding_type(t.name) for t in plan.tables} == {"table_wise", "column_wise", "row_wise", "grid_shard"}
    again = torchrec_sharding(plan, compute_device="cuda", local_world_size=2)
    assert _shards(again["tables"]) == _shards(original)

    # The command-line way: {module path: {table: record}} JSON -> import -> score -> export.
    source = tmp_path / "torchrec_plan.json"
    source.write_text(json.dumps({"sparse.ebc": original}))
    tables_path = TABLES.write(tmp_path / "tables.json")
    model = analytic_cost_models().save(tmp_path / "analytic.pt")
    imported = tmp_path / "imported.json"
    done = run_cli("plan", "import", source, "--format", "torchrec", "--tables", tables_path, "--devices", "4",
                   "--memory", "2MiB", "-o", imported)
    assert done.returncode == 0, done.stderr
    assert Plan.read(imported).problems() == []
    scored = tmp_path / "scored.json"
    done = run_cli("plan", "score", imported, "--tables", tables_path, "--cost-model", model, "-o", scored)
    assert done.returncode == 0, done.stderr
    assert "estimated max device cost" in done.stdout and "balanced bound" in done.stdout
    estimate = Plan.read(scored).estimate
    assert estimate["batch_size"] == 1024 and len(estimate["per_device_cost_ms"]) == 4
    exported = tmp_path / "exported.json"
    done = run_cli("export", scored, "--format", "torchrec", "--compute-device", "cuda", "--local-world-size", "2",
                   "-o", exported)
    assert done.returncode == 0, done.stderr
    assert _shards(json.loads(exported.read_text())["tables"]) == _shards(original)

    # `plan show` of the export says what it is; `plan score` reads TorchRec's JSON directly.
    done = run_cli("plan", "show", exported)
    assert done.returncode == 0, done.stderr
    assert "TorchRec sharding export" in done.stdout and "plan import" in done.stdout
    done = run_cli("plan", "show", source)
    assert done.returncode == 0 and "TorchRec plan (ParameterSharding records)" in done.stdout, done.stderr
    done = run_cli("plan", "show", tables_path)  # not a plan at all: the plan reader's one line
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    done = run_cli("plan", "score", source, "--tables", tables_path, "--cost-model", model)
    assert done.returncode == 0 and "estimated max device cost" in done.stdout, done.stderr


@pytest.mark.torchrec
def test_torchrecs_own_planner_round_trips(tmp_path):
    pytest.importorskip("torchrec.distributed.planner")
    tables = TableSet("small", TABLES.tables[:4], 1024)
    plan = search_plan(tables, devices=2, memory="8MiB", algorithm="torchrec", cost_models=analytic_cost_models())
    exported = torchrec_sharding(plan, compute_device="cpu")
    back = plan_from_torchrec(json.loads(json.dumps(exported)), tables)
    def key(s):
        return (s.table, s.row_offset, s.col_offset, s.num_rows, s.num_cols, s.device)
    assert sorted(back.shards, key=key) == sorted(plan.shards, key=key) and back.num_devices == 2


def test_bad_torchrec_plans_are_one_line_errors(tmp_path):
    good = {"a": {"sharding_type": "table_wise", "compute_kernel": "fused", "ranks": [0],
                  "sharding_spec": [{"shard_offsets": [0, 0], "shard_sizes": [100, 16], "placement": "rank:0/cpu"}]}}
    tables = TableSet("one", [Table("a", 100, 16, 1.0)])
    assert plan_from_torchrec(good, tables).shards[0].num_rows == 100
    with pytest.raises(FormatError, match="placement"):
        plan_from_torchrec({"a": {**good["a"], "sharding_spec": [{**good["a"]["sharding_spec"][0],
                                                                   "placement": "cuda:0"}]}}, tables)
    empty = {"a": {"sharding_type": "row_wise", "ranks": [0, 1, 2], "sharding_spec": [
        {"shard_offsets": [0, 0], "shard_sizes": [50, 16], "placement": "rank:0/cpu"},
        {"shard_offsets": [50, 0], "shard_sizes": [50, 16], "placement": "rank:1/cpu"},
        {"shard_offsets": [100, 0], "shard_sizes": [0, 16], "placement": "rank:2/cpu"}]}}
    assert len(plan_from_torchrec(empty, tables, num_devices=3).shards) == 2  # TorchRec's empty last block
    # TorchRec's data_parallel (revision 3): the plan's replicated table
    replicated = plan_from_torchrec({"a": {"sharding_type": "data_parallel", "ranks": [0, 1], "sharding_spec": None}},
                                    tables)
    assert replicated.data_parallel_tables == ["a"] and replicated.num_devices == 2 and not replicated.shards
    assert replicated.device_memory_bytes == 100 * 16 * 4  # the whole table on each rank
    with pytest.raises(FormatError, match="table 'a' is data_parallel on ranks \\[1\\], not on all 2"):
        plan_from_torchrec({"a": {"sharding_type": "data_parallel", "ranks": [1]}}, tables, num_devices=2)
    with pytest.raises(InvalidPlanError, match="not covered"):
        plan_from_torchrec({"a": {**good["a"], "sharding_spec": [{**good["a"]["sharding_spec"][0],
                                                                   "shard_sizes": [90, 16]}]}}, tables)
    with pytest.raises(InvalidPlanError, match="does not match"):
        plan_from_torchrec(good, TableSet("two", [Table("a", 100, 16, 1.0), Table("z", 5, 4, 1.0)]))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something/v9"}))
    tables_path = tables.write(tmp_path / "tables.json")
    done = run_cli("plan", "import", bad, "--tables", tables_path, "-o", tmp_path / "never.json")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not a TorchRec plan" in done.stderr and not (tmp_path / "never.json").exists()


def test_rescoring_uses_the_batch_size_of_the_estimate():
    models = analytic_cost_models()
    plan = search_plan(TABLES, devices=2, memory="2MiB", algorithm="size", cost_models=models)
    assert plan.estimate["batch_size"] == 1024
    again = score_plan(Plan.from_dict(json.loads(json.dumps(plan.to_dict()))), cost_models=models)
    assert again.estimate["max_device_cost_ms"] == pytest.approx(plan.estimate["max_device_cost_ms"], rel=1e-6)
    half = score_plan(plan, cost_models=models, batch_size=512)
    assert half.estimate["batch_size"] == 512
    assert half.estimate["max_device_cost_ms"] < plan.estimate["max_device_cost_ms"]
    old = plan.to_dict()
    del old["estimate"]["batch_size"]  # a plan written before the field still reads
    assert Plan.from_dict(old).estimate["max_device_cost_ms"] == plan.estimate["max_device_cost_ms"]
