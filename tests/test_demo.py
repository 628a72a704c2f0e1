"""`neuroshard demo`: the whole path on a small task (searches, real kernels timed on gloo processes)."""
import pytest

from conftest import run_cli


@pytest.mark.timing
@pytest.mark.gloo
def test_demo_runs_end_to_end_small(tmp_path):
    out = tmp_path / "demo"
    # --calibrate never: the suite takes the same time on every CPU (calibration has its own tests)
    result = run_cli("demo", "--out", out, "--tables", "6", "--devices", "2", "--iterations", "2", "--rounds", "2",
                     "--calibrate", "never")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "memory_used" in result.stdout and "measured improvement of NeuroShard" in result.stdout
    for name in ("tables.json", "plan-neuroshard.json", "summary.json", "demo-per-device.png"):
        assert (out / name).exists(), name
    assert run_cli("plan", "validate", out / "plan-neuroshard.json").returncode == 0
