import json

import pytest
from conftest import run_cli

from neuroshard import FormatError, InvalidPlanError, Plan, Shard, TableSet
from neuroshard.errors import NeuroShardError
from neuroshard.units import parse_bytes


def make_plan(tables_file, shards, memory=10**6, devices=2) -> Plan:
    tables = TableSet.read(tables_file)
    return Plan(tables.tables, shards, devices, memory, tables_name=tables.name,
                provenance={"algorithm": "hand"})


GOOD = [
    Shard("t0", 0, 2000, 0, 32, 0), Shard("t0", 2000, 2000, 0, 16, 1), Shard("t0", 2000, 2000, 16, 16, 0),
    Shard("t1", 0, 3000, 0, 8, 1), Shard("t1", 0, 3000, 8, 8, 1),
    Shard("t2", 0, 500, 0, 8, 0),
]


def test_valid_mixed_plan_round_trips(tmp_path, tables_file):
    plan = make_plan(tables_file, GOOD)
    assert plan.problems() == []
    assert plan.sharding_type("t0") == "grid_shard" and plan.sharding_type("t1") == "column_wise"
    assert plan.sharding_type("t2") == "table_wise"
    path = tmp_path / "plan.json"
    plan.write(path)
    again = Plan.read(path)
    assert again.shards == plan.shards and again.to_dict() == plan.to_dict()
    assert sum(again.memory_used_bytes()) == sum(t.size_bytes() for t in again.tables)


@pytest.mark.parametrize("shards, message", [
    (GOOD[:-1], "table 't2' has no shard"),
    (GOOD[:2] + GOOD[3:], "table 't0': rows [2000, 4000) x cols [16, 32) not covered"),
    (GOOD + [Shard("t2", 100, 50, 0, 8, 1)], "table 't2': rows [100, 150) x cols [0, 8) covered by more than one shard"),
    (GOOD[:-1] + [Shard("t2", 0, 600, 0, 8, 0)], "lies outside the table's 500 x 8"),
    (GOOD[:-1] + [Shard("t2", 0, 500, 0, 8, 5)], "device 5 is outside 0..1"),
    (GOOD + [Shard("zz", 0, 1, 0, 1, 0)], "table 'zz' is not among the plan's tables"),
])
def test_validate_says_what_is_wrong(tables_file, shards, message):
    plan = make_plan(tables_file, shards)
    with pytest.raises(InvalidPlanError) as err:
        plan.validate()
    assert message in str(err.value)


def test_memory_overflow_is_reported_by_device(tables_file):
    plan = make_plan(tables_file, GOOD, memory=300_000)
    problems = plan.problems()
    assert any(p.startswith("device 0: shards need") and "over its 300000" in p for p in problems)


def test_invalid_plan_is_never_written(tmp_path, tables_file):
    plan = make_plan(tables_file, GOOD[:-1])
    with pytest.raises(InvalidPlanError):
        plan.write(tmp_path / "plan.json")
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.slow
def test_cli_validate_and_show(tmp_path, tables_file):
    path = tmp_path / "plan.json"
    make_plan(tables_file, GOOD).write(path)
    ok = run_cli("plan", "validate", path)
    assert ok.returncode == 0 and "valid plan" in ok.stdout
    shown = run_cli("plan", "show", path)
    assert shown.returncode == 0 and "memory_used" in shown.stdout and "device" in shown.stdout
    # which table, which rows and columns, on which device
    assert "device 0: t0 rows 0-1,999, t0 rows 2,000-3,999 cols 16-31, t2" in shown.stdout
    assert "device 1: t0 rows 2,000-3,999 cols 0-15, t1 cols 0-7, t1 cols 8-15" in shown.stdout
    data = json.loads(path.read_text())
    data["shards"].pop()
    path.write_text(json.dumps(data))
    bad = run_cli("plan", "validate", path)
    assert bad.returncode == 1 and "table 't2' has no shard" in bad.stderr


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="neuroshard.plan/v2"), "field 'format'"),
    (lambda d: d.pop("num_devices"), "field 'num_devices' is missing"),
    (lambda d: d["shards"][0].update(num_rows=-3), "shard #0 (table 't0'): field 'num_rows'"),
    (lambda d: d["shards"][1].pop("device"), "shard #1 (table 't0'): field 'device' is missing"),
])
def test_bad_plan_files(tmp_path, tables_file, mutate, message):
    data = make_plan(tables_file, GOOD).to_dict()
    mutate(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError) as err:
        Plan.read(path)
    assert message in str(err.value) and str(path) in str(err.value)
    result = run_cli("plan", "show", path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_check_matches_refuses_other_tables(tables_file):
    plan = make_plan(tables_file, GOOD)
    tables = TableSet.read(tables_file)
    plan.check_matches(tables)
    tables.tables[0].num_embeddings = 10
    with pytest.raises(InvalidPlanError, match="table 't0' is 4000x32 in the plan"):
        plan.check_matches(tables)


def test_memory_units():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("16GB") == 16 * 10**9
    assert parse_bytes("1.5 MiB") == 1572864
    assert parse_bytes("4096") == 4096
    for bad in ("lots", "-1GB", "12 parsecs"):
        with pytest.raises(NeuroShardError):
            parse_bytes(bad)
