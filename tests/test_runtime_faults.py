"""A crashed or hung process ends the run with one clear line; bad plans never start."""
from __future__ import annotations

import time

import pytest
from conftest import run_cli

from neuroshard.errors import InvalidPlanError
from neuroshard.execution.launch import RunFailedError
from neuroshard.plan import Plan, Shard
from neuroshard.runtime.evaluate import evaluate
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.tables import Table, TableSet

TABLES = [Table(f"t{i}", 100 + 20 * i, 8, 1.0) for i in range(4)]


def _plan(tables=TABLES, devices: int = 2) -> Plan:
    shards = [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % devices) for i, t in enumerate(tables)]
    return Plan(list(tables), shards, devices, 10**9, tables_name="faults").validate()


def _config(**kw) -> RunConfig:
    return RunConfig(_plan(), list(TABLES), 2, steps=4, batch_size=16, **kw)


@pytest.mark.gloo
def test_a_rank_that_raises_stops_the_run_with_its_error():
    with pytest.raises(RunFailedError, match=r"^rank 1 failed at step 1.*injected fault at step 1$") as info:
        run(_config(fault="raise:1:1", timeout_s=30))
    assert "\n" not in str(info.value)


@pytest.mark.gloo
def test_a_hung_rank_is_named_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(RunFailedError, match=r"^rank 0 (made no progress|stopped responding) .*step 2") as info:
        run(_config(fault="hang:0:2", timeout_s=5))
    assert "\n" not in str(info.value)
    assert time.monotonic() - start < 60


@pytest.mark.gloo
def test_cli_reports_a_dead_rank_in_one_line(tmp_path):
    TableSet("faults", TABLES, 16).write(tmp_path / "tables.json")
    _plan().write(tmp_path / "plan.json")
    out = run_cli("train", "--plan", "plan.json", "--tables", "tables.json", "--steps", "4", "--timeout", "30",
                  cwd=tmp_path, timeout=120, env={"NEUROSHARD_FAULT": "exit:0:1"})
    errors = [line for line in out.stderr.splitlines() if line.startswith("neuroshard: error:")]
    assert out.returncode == 2
    assert errors == ["neuroshard: error: rank 0 exited with code 3 at step 1, preparing inputs; the run was stopped"]


def test_cli_refuses_a_plan_for_other_tables(tmp_path):
    TableSet("faults", TABLES, 16).write(tmp_path / "tables.json")
    other = [Table(t.name, t.num_embeddings + 1, 8, 1.0) for t in TABLES]
    _plan(other).write(tmp_path / "plan.json")
    start = time.monotonic()
    out = run_cli("evaluate", "--plan", "plan.json", "--tables", "tables.json", cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "neuroshard: error: plan does not match tables 'faults': table 't0' is 101x8 in the plan, 100x8 in the file"]
    assert time.monotonic() - start < 30


def test_refuses_more_devices_than_given():
    with pytest.raises(InvalidPlanError, match="plan needs 2 devices, only 1 given"):
        evaluate(_plan(), TableSet("faults", TABLES, 16), devices=1)
