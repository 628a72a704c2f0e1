"""The scripts of examples/ run as a user runs them: ``python examples/<name>.py`` from the
repository root (smaller arguments where a default would take long), exit 0 and print
what they are for."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tables_dict

from neuroshard.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python examples/NAME ARGS`` in the repository root; the output, checked for exit 0."""
    done = subprocess.run([sys.executable, f"examples/{name}", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_every_example_is_listed_in_the_readme_and_tested_here():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == ["plan_your_tables.py", "tiers_and_export.py", "torchrec_planner.py", "train_and_evaluate.py"]
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    tests = Path(__file__).read_text(encoding="utf-8")
    for script in scripts:
        assert f"({script})" in readme and f"python examples/{script}" in readme, script
        assert f'run_example("{script}"' in tests, script


@pytest.mark.slow
def test_plan_your_tables_generated_and_your_own(tmp_path):
    """Generated tables planned and written; then a tables file of one's own (``--tables``)."""
    out = run_example("plan_your_tables.py", "--num-tables", "12", "--devices", "4", "--out", tmp_path / "gen")
    assert "12 synthetic dlrm-2021 tables" in out.stdout and "plan for 'dlrm-2021-t12-s0': 12 tables" in out.stdout
    assert "slowest device:" in out.stdout and Plan.read(tmp_path / "gen" / "plan.json").num_devices == 4
    mine = tmp_path / "tables.json"
    mine.write_text(json.dumps(tables_dict()))
    out = run_example("plan_your_tables.py", "--tables", mine, "--devices", "2", "--memory", "1MiB",
                      "--out", tmp_path / "mine")
    assert "plan for 'small': 3 tables" in out.stdout and "synthetic" not in out.stdout
    assert [t.name for t in Plan.read(tmp_path / "mine" / "plan.json").tables] == ["t0", "t1", "t2"]


@pytest.mark.slow
def test_tiers_and_export_prints_each_tables_kernel(tmp_path):
    """Capacity, then a plan with tables in host memory, exported: cached tables run
    ``fused_uvm_caching`` with their load factor, the others ``fused``."""
    out = run_example("tiers_and_export.py", "--out", tmp_path)
    assert "== capacity" in out.stdout and "all rows in device memory:" in out.stdout
    assert "memory tiers (tables outside device memory)" in out.stdout
    exported = json.loads((tmp_path / "plan.torchrec.json").read_text())
    kernels = {name: record["compute_kernel"] for name, record in exported["tables"].items()}
    assert {"fused", "fused_uvm_caching"} <= set(kernels.values()) and len(kernels) == 12
    for name, record in exported["tables"].items():  # each table's line says what the file says
        line = f"  {name:<4} {record['sharding_type']:<12} on ranks {record['ranks']}: {record['compute_kernel']}"
        if "cache_params" in record:
            line += f", cache load_factor {record['cache_params']['load_factor']:g}"
        assert line in out.stdout, line


@pytest.mark.torchrec
@pytest.mark.gloo
@pytest.mark.slow
def test_torchrec_planner_script_trains_in_dmp_and_prints_the_comparison(tmp_path):
    """The complete DMP script on 2 spawned gloo processes: planned by NeuroShardPlanner,
    its comparison with TorchRec's plan printed, training steps run."""
    pytest.importorskip("torchrec.distributed.planner")
    out = run_example("torchrec_planner.py", "--steps", "2", "--out", tmp_path)
    assert Plan.read(tmp_path / "plan.json").num_devices == 2
    assert "TorchRec's EmbeddingShardingPlanner on the same task" in out.stdout
    assert "plan for 'RecModel': 8 tables" in out.stdout
    assert "step 1: loss" in out.stdout and "trained 2 steps on 2 ranks with NeuroShard's plan" in out.stdout


@pytest.mark.timing
@pytest.mark.gloo
@pytest.mark.slow
def test_train_and_evaluate_prints_the_ratio_with_its_noise_band(tmp_path):
    out = run_example("train_and_evaluate.py", "--steps", "3", "--runs", "2", "--iterations", "6",
                      "--out", tmp_path)
    assert "trained 3 steps on 2 gloo processes" in out.stdout
    assert "size-lookup's" in out.stdout and "A/A noise band" in out.stdout and "over 2 runs" in out.stdout
    assert (tmp_path / "plan.json").exists() and (tmp_path / "plan-size-lookup.json").exists()
