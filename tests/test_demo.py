"""`neuroshard demo`: the whole path on a small task (searches, real kernels timed on gloo processes)."""
import json

import pytest
from conftest import run_cli


@pytest.mark.timing
@pytest.mark.gloo
def test_demo_runs_end_to_end_small(tmp_path):
    out = tmp_path / "demo"
    # --calibrate 0: the suite takes the same time on every CPU (calibration has its own tests); the
    # default --refine 1 still times the demo's set count for its rounds
    result = run_cli("demo", "--out", out, "--num-tables", "6", "--devices", "2", "--iterations", "2", "--runs", "2",
                     "--calibrate", "0")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "memory_used" in result.stdout and "measured improvement of NeuroShard" in result.stdout
    assert "A/A control" in result.stdout  # the noise band every comparison is read against
    assert "neuroshard --refine 1:" in result.stdout  # the default: the measured loop chose the plan
    for name in ("tables.json", "plan-neuroshard.json", "summary.json", "demo-per-device.png"):
        assert (out / name).exists(), name
    assert run_cli("plan", "validate", out / "plan-neuroshard.json").returncode == 0
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["aa_noise"] < 1 and len(summary["measured_ms"]) == 3
    assert summary["refine"]["rounds"] == 1 and summary["refine"]["chosen"]
