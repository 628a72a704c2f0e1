"""Issue 16 item 2: per-table constraints in the tables file, honoured by every algorithm."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import algorithm_params, tables_dict

import neuroshard
from neuroshard.cli import main
from neuroshard.constants import SHARDING_TYPES
from neuroshard.constraints import TableConstraints
from neuroshard.errors import FormatError, InvalidPlanError
from neuroshard.plan import Plan, Shard
from neuroshard.tables import Table, TableSet
from neuroshard.torchrec.export import torchrec_sharding
from neuroshard.torchrec.guard import torchrec_available
from neuroshard.types import layout_kind

MEMORY = 20 * 2**20  # 6 tables of 2.6-15.4 MB (53.8 MB) on 4 devices: the largest fits one device, not two


def _task(constraints: dict[int, dict]) -> TableSet:
    tables = [Table(f"t{i}", 20000 * (i + 1), 32, 2.0 + i) for i in range(6)]
    data = TableSet("c", tables, batch_size=2048).to_dict()
    for i, c in constraints.items():
        data["tables"][i]["constraints"] = c
    return TableSet.from_dict(data)  # through the file format, as a user's file


PINNED = {0: {"devices": [1]},
          3: {"sharding_types": ["column_wise"], "min_shards": 2, "devices": [0, 2]},
          4: {"sharding_types": ["row_wise", "table_row_wise"]},
          5: {"max_shards": 1}}
# TorchRec's planner cannot pin tables and has no row-wise kernel on CPU: its own set
UNPINNED = {3: {"sharding_types": ["column_wise"], "min_shards": 2}, 5: {"sharding_types": ["table_wise"]}}


def _strips(plan: Plan, name: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for s in plan.shards_of(name):
        out[s.col_offset] = out.get(s.col_offset, 0) + 1
    return out


@pytest.mark.parametrize("algorithm", algorithm_params())
def test_every_algorithm_keeps_the_constraints(algorithm, analytic_models):
    if algorithm == "torchrec" and not torchrec_available():
        pytest.skip("needs TorchRec")
    torchrec = algorithm == "torchrec"
    tables = _task(UNPINNED if torchrec else PINNED)
    memory = 3 * MEMORY if torchrec else MEMORY  # TorchRec also counts its input/output buffers
    params = {"passes": 1, "repeats": 1, "batch_size": 256} if algorithm == "measured-greedy" else {}
    plan = neuroshard.shard(tables, devices=4, memory=memory, algorithm=algorithm, cost_models=analytic_models,
                            **params)
    assert plan.problems() == []
    t3 = _strips(plan, "t3")
    assert len(t3) >= 2 and set(t3.values()) == {1}  # column-wise, at least 2 shards
    assert [t.constraints for t in plan.tables] == [t.constraints for t in tables]  # the plan carries them
    if torchrec:
        assert len(plan.shards_of("t5")) == 1
        return
    assert {s.device for s in plan.shards_of("t0")} == {1}
    assert {s.device for s in plan.shards_of("t3")} <= {0, 2}
    t4 = _strips(plan, "t4")
    assert len(t4) == 1 and list(t4.values())[0] > 1  # one strip in row blocks
    assert len(plan.shards_of("t5")) == 1


def test_a_plan_breaking_its_constraints_is_reported_naming_the_table():
    tables = _task({2: {"devices": [3], "sharding_types": ["table_wise"]}})
    shards = [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % 4) for i, t in enumerate(tables)]
    plan = Plan(list(tables), shards, 4, MEMORY)
    assert plan.problems() == ["table 't2' has shards on device 2, outside its pinned devices [3]"]
    with pytest.raises(InvalidPlanError, match="table 't2' has shards on device 2"):
        plan.validate()
    split = [s for s in shards if s.table != "t2"] + [Shard("t2", 0, 60000, 0, 16, 3), Shard("t2", 0, 60000, 16, 16, 3)]
    assert replace(plan, shards=split).problems() == [
        "table 't2' breaks its constraints: its layout is column_wise, not one of its sharding_types ['table_wise']"]
    free = replace(plan, tables=[replace(t, constraints={}) for t in plan.tables])
    assert free.problems() == [] and "constraints" not in json.dumps(free.to_dict())


def test_layout_kinds_are_torchrecs_names():
    assert layout_kind([1], 8, 8) == "table_wise"
    assert layout_kind([1, 1], 8, 8) == "column_wise"
    assert layout_kind([8], 8, 8) == "row_wise"
    assert layout_kind([4], 8, 4) == "table_row_wise"
    assert layout_kind([4, 4], 8, 4) == "grid_shard"
    rule = TableConstraints("t", frozenset({"grid_shard"}), None, 1, 8)
    assert rule.layout_problem([4, 4], 8, 4) is None
    assert "more than its max_shards 8" in rule.layout_problem([4, 4, 4], 8, 4)


def test_old_tables_read_unchanged_and_permissive_constraints_change_nothing(analytic_models):
    data = tables_dict()
    assert TableSet.from_dict(data).to_dict() == {**data, "tables": data["tables"]}
    assert all(t.constraints == {} for t in TableSet.from_dict(data))
    tables = _task({})
    every = _task({i: {"sharding_types": list(SHARDING_TYPES)} for i in range(6)})
    for algorithm in ("neuroshard", "size"):
        a = neuroshard.shard(tables, devices=4, memory=MEMORY, algorithm=algorithm, cost_models=analytic_models)
        b = neuroshard.shard(every, devices=4, memory=MEMORY, algorithm=algorithm, cost_models=analytic_models)
        assert a.shards == b.shards and a.estimate == b.estimate


def test_constraints_round_trip_and_bad_ones_name_file_table_field(tmp_path):
    path = tmp_path / "t.json"
    data = _task(PINNED).to_dict()
    path.write_text(json.dumps(data))
    again = TableSet.read(path)
    assert again.to_dict() == data and again["t3"].constraints == PINNED[3]
    data["tables"][1]["constraints"] = {"sharding_types": ["row_wise"], "devices": [0, 0]}
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=r"t\.json: table #1 't1': field 'constraints.devices'"):
        TableSet.read(path)


def test_search_cli_honours_constraints_and_plan_score_and_import_report_them(tmp_path, capsys, analytic_models):
    checkpoint = analytic_models.save(tmp_path / "analytic.pt")  # the CLI takes a path
    tables = tmp_path / "t.json"
    _task(PINNED).write(tables)
    plan_path = tmp_path / "p.json"
    assert main(["search", str(tables), "-d", "4", "-m", str(MEMORY), "-a", "size", "--cost-model",
                 str(checkpoint), "-o", str(plan_path)]) == 0
    plan = Plan.read(plan_path)
    assert plan.problems() == [] and {s.device for s in plan.shards_of("t0")} == {1}
    # the same tables with t0 pinned elsewhere: score warns, naming the table
    moved = _task({**PINNED, 0: {"devices": [2]}})
    moved_path = tmp_path / "moved.json"
    moved.write(moved_path)
    bare = replace(plan, tables=[replace(t, constraints={}) for t in plan.tables])
    bare_path = tmp_path / "bare.json"
    bare.write(bare_path)
    capsys.readouterr()
    assert main(["plan", "score", str(bare_path), "--tables", str(moved_path), "--cost-model",
                 str(checkpoint)]) == 0
    err = capsys.readouterr().err
    assert "table 't0' has shards on device 1, outside its pinned devices [2]" in err
    if not torchrec_available():
        return
    exported = tmp_path / "tr.json"
    exported.write_text(json.dumps(torchrec_sharding(bare, compute_device="cpu")))
    assert main(["plan", "import", str(exported), "--format", "torchrec", "--tables", str(moved_path),
                 "-o", str(tmp_path / "imported.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "table 't0' has shards on device 1, outside its pinned devices [2]" in err[0]
