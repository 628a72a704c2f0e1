"""Every command that takes a plan runs the same check first (``Plan.read_checked``): a plan
naming a table it does not list, a shard on a device it does not have, or a table with no
shard is refused in one line naming the file, never costed, trained, measured or exported;
``plan show`` shows what it can and says what is wrong, without a traceback."""
from __future__ import annotations

import json

import pytest

from neuroshard.cli import EXIT_INVALID, main
from neuroshard.errors import InvalidPlanError
from neuroshard.plan import Plan
from neuroshard.tables import TableSet

BREAKS = {
    "unknown-table": lambda d: d["shards"][0].update(table="nosuch"),
    "device-outside": lambda d: d["shards"][0].update(device=5),
    "table-without-shard": lambda d: d["shards"].pop(0),
    "row-missing": lambda d: d["shards"][0].update(num_rows=d["shards"][0]["num_rows"] - 1),
}


@pytest.fixture
def plan_file(tables_file, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["search", str(tables_file), "-d", "2", "-m", "1MiB", "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_every_command_that_takes_a_plan_refuses_an_invalid_one(plan_file, tables_file, tmp_path, capsys, broken):
    data = json.loads(plan_file.read_text())
    BREAKS[broken](data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    t = str(tables_file)
    for args in (["estimate", str(bad), "--tables", t], ["export", str(bad), "-o", str(tmp_path / "x.json")],
                 ["train", str(bad), "--tables", t, "--steps", "1"], ["evaluate", str(bad), "--tables", t],
                 ["measure", str(bad), "--tables", t], ["plan", "score", str(bad), "--tables", t]):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "invalid plan" in err[0], (args, err)
    assert not (tmp_path / "x.json").exists()
    assert main(["plan", "show", str(bad)]) == EXIT_INVALID
    out, err = capsys.readouterr()
    assert f"{bad}: plan is invalid:" in err and "Traceback" not in err


def test_read_checked_names_the_file_and_the_tables(plan_file, tables_file):
    tables = TableSet.read(tables_file)
    assert Plan.read_checked(plan_file, tables).num_devices == 2
    data = json.loads(plan_file.read_text())
    data["shards"][0]["device"] = 9
    plan_file.write_text(json.dumps(data))
    with pytest.raises(InvalidPlanError, match=f"^{plan_file}: invalid plan: shard #0 .*device 9"):
        Plan.read_checked(plan_file, tables)
