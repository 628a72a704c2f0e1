"""On-site calibration: real kernels timed here, the shipped model fine-tuned, cached per task."""
from __future__ import annotations

import numpy as np

from neuroshard.cli import main
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.calibrate import cache_dir, calibrate
from neuroshard.costmodels.base import CostModels
from neuroshard.tables import Table, TableSet

TABLES = TableSet("calib", [Table(f"t{i}", 1_000 * (i + 1), 16 if i % 2 else 32, 1.0 + 2 * (i % 4),
                                  {"zipf_alpha": 0.9}) for i in range(12)], 4096)


def test_calibrate_fine_tunes_and_reports_held_out_error():
    models = load_cost_models()
    calibrated, report = calibrate(TABLES, models, devices=3, sets=16, epochs=40)
    assert report.tables == 12 and report.sets_measured == 12 + 16 and report.held_out >= 2
    assert np.isfinite(report.gmae_before) and np.isfinite(report.gmae_after)
    assert "held-out sets" in report.format()
    assert calibrated.name.endswith("+calibrated:calib") and "calibration" in calibrated.metrics
    assert calibrated.comm is models.comm  # communication is not recalibrated
    assert models.compute.predict([np.zeros((1, 22), np.float32)]) is not None  # the original is untouched


def test_search_calibrate_caches_per_task(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    TABLES.write(tmp_path / "t.json")
    args = ["search", str(tmp_path / "t.json"), "-d", "3", "-m", "4MiB", "--calibrate", "12", "-o", str(tmp_path / "p.json")]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "held-out sets" in first and "+calibrated:calib" in first
    cached = list(cache_dir().glob("*.pt"))
    assert len(cached) == 1 and CostModels.load(cached[0]).name.endswith("+calibrated:calib")
    assert main(args) == 0  # the second search finds the calibration in the cache: nothing is measured
    assert "held-out sets" not in capsys.readouterr().out


def test_calibrate_cli_writes_a_checkpoint(tmp_path, capsys):
    TABLES.write(tmp_path / "t.json")
    assert main(["calibrate", str(tmp_path / "t.json"), "-d", "3", "--sets", "8", "-o", str(tmp_path / "c.pt")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert CostModels.load(tmp_path / "c.pt").name.endswith("+calibrated:calib")
    assert main(["calibrate", str(tmp_path / "t.json"), "-o", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
