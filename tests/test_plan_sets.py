"""``collect compute --sets plans``: devices of searched plans, measured with the real kernel."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli

from neuroshard.costmodels.pretrain import load_compute
from neuroshard.measured.plan_sets import DEVICES_PER_TASK, TASK_DEVICES, PlanSetSampler
from neuroshard.tables import Table, TableSet

TABLES = TableSet("plan-sets", [Table(f"t{i}", 500 * (i + 1), (8, 16, 32)[i % 3], 0.5 + i % 6,
                                      {"zipf_alpha": 0.9}) for i in range(90)], 256)


def test_samples_are_devices_of_one_searched_plan():
    sampler = PlanSetSampler(TABLES.tables, 256, seed=3, alloc_bytes=1 << 30, max_rows=10_000)
    plan, tables = sampler.plan(0)
    assert plan.num_devices in TASK_DEVICES and plan.validate()
    sets = [sampler(i) for i in range(DEVICES_PER_TASK)]
    on_devices = {tuple(sorted(s.table for s in plan.shards_on(d))) for d in range(plan.num_devices)}
    for shards in sets:  # each sample is exactly the shards of one device of task 0's plan
        assert tuple(sorted(t.extra["source_table"] for t in shards)) in on_devices
    again = PlanSetSampler(TABLES.tables, 256, seed=3, alloc_bytes=1 << 30, max_rows=10_000)
    assert [t.name for t in again(1)] == [t.name for t in sets[1]]  # sample i depends on the seed and i only


@pytest.mark.timing
def test_collect_plan_sets_writes_loadable_records(tmp_path):
    TABLES.write(tmp_path / "tables.json")
    out = tmp_path / "plans"
    result = run_cli("collect", "compute", tmp_path / "tables.json", "--sets", "plans", "--samples", "3", "-o", out,
                     "--memory", "1GiB", "--batch-size", "256", "--flush-bytes", "4MiB", "--warmup", "0",
                     "--repeats", "2", "--max-repeats", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "compute.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["cost_ms"] > 0 for r in records)
    assert json.loads((out / "meta.json").read_text())["config"]["sets"] == "plans"
    data = load_compute(out)
    assert len(data) == 3 and np.all(data.costs_ms > 0)
