"""Issue 29's "done when", end to end through the command line: a task whose tables are
3x the devices' memory plans with cached shards, validates, trains on the included
runtime (2 gloo processes) with numerics equal to the unsharded model, and exports to
TorchRec with cache params."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import _runtime_tables, run_cli

from neuroshard.plan import Plan
from neuroshard.runtime.model import train_reference
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.tables import TableSet

STEPS, BATCH, LR = 8, 48, 5.0


@pytest.mark.gloo
@pytest.mark.torchrec
def test_three_times_device_memory_plans_trains_and_exports(tmp_path):
    tables = TableSet("tiered-e2e", _runtime_tables(), batch_size=BATCH)
    path = tmp_path / "tables.json"
    tables.write(path)
    total = tables.total_bytes()
    memory = total // 6  # 2 devices hold a third of the tables
    plan_path = tmp_path / "plan.json"
    refused = run_cli("search", path, "-d", "2", "-m", memory, "-a", "size-lookup", "-o", plan_path)
    assert refused.returncode != 0 and "--host-memory" in refused.stderr and not plan_path.exists()
    done = run_cli("search", path, "-d", "2", "-m", memory, "-a", "size-lookup", "--host-memory", total,
                   "--ssd", 10 * total, "-o", plan_path)
    assert done.returncode == 0, done.stderr
    plan = Plan.read(plan_path)
    assert plan.tiered and not plan.problems() and max(plan.memory_used_bytes()) <= memory
    assert any(t.cached for t in plan.tiers().values())
    assert run_cli("plan", "validate", plan_path).returncode == 0

    result = run(RunConfig(plan, list(tables), 2, steps=STEPS, batch_size=BATCH, lr=LR, collect_weights=True,
                           timeout_s=90))
    reference = train_reference(list(tables), STEPS, BATCH, LR)
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    for t in tables:
        np.testing.assert_allclose(result.weights[t.name], reference.weights[t.name].numpy(), rtol=0, atol=1e-5)
    assert set(result.cache) == {n for n, tier in plan.tiers().items() if not tier.on_device}

    export = tmp_path / "torchrec.json"
    out = run_cli("export", plan_path, "--compute-device", "cpu", "-o", export)
    assert out.returncode == 0, out.stderr
    records = json.loads(export.read_text())["tables"]
    for name, tier in plan.tiers().items():
        if tier.cached and tier.memory == "host":
            assert records[name]["compute_kernel"] == "fused_uvm_caching"
            assert records[name]["cache_params"]["load_factor"] == pytest.approx(tier.cache_fraction)
