"""Checkpoints: round trips, schema version, atomic writes, load_cost_models, the pretrain command."""
from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from conftest import run_cli

import neuroshard.costmodels.loading as costmodels  # where load_cost_models reads DEFAULT_CHECKPOINT
from neuroshard.costmodels import CostModels, load_cost_models
from neuroshard.costmodels.analytic import AnalyticCommModel, AnalyticComputeModel
from neuroshard.costmodels.neural import NeuralCommModel, NeuralComputeModel
from neuroshard.costmodels.pretrain import load_comm, load_compute
from neuroshard.costmodels.tree import TreeCommModel, TreeComputeModel
from neuroshard.errors import NeuroShardError


@pytest.fixture(scope="module")
def folders(measured_folders) -> dict:
    """Measured on this machine (real kernels, gloo): the tests using it are marked timing and gloo."""
    return measured_folders


@pytest.fixture(scope="module")
def neural_bundle(folders) -> CostModels:
    data = load_compute(folders["compute"])
    groups, meta = load_comm([folders["comm2"]])
    compute = NeuralComputeModel(hidden=32, depth=2, epochs=20, seed=0).fit(data.sets, data.costs_ms)
    comm = NeuralCommModel(meta["batch_size"], epochs=20, seed=0).fit(groups)
    return CostModels(compute, comm, data.batch_size, hardware=data.meta.get("hardware", {}), name="test")


@pytest.fixture(scope="module")
def small_bundle(reference_data) -> CostModels:
    """Small neural models fitted on the checked-in reference data (tests/data): no kernel is timed."""
    compute = NeuralComputeModel(hidden=16, depth=2, epochs=10, patience=5, seed=0)
    comm = NeuralCommModel(4096, hidden=8, epochs=10, seed=0)
    return CostModels(compute.fit(reference_data["sets"], reference_data["compute_ms"]),
                      comm.fit(reference_data["comm"]), 4096, hardware={"cpu_model": "test"}, name="small")


def predictions(models: CostModels, folders: dict) -> list[np.ndarray]:
    data = load_compute(folders["compute"])
    widths, skews = np.array([[64.0, 128.0, 0.0]]), np.array([[0.0, 1.5, 0.3]])
    comm = models.comm_for(3)
    return [models.compute.predict(data.sets), comm.predict_forward(widths, skews), comm.predict_backward(widths),
            comm.predict_reduce([32.0])]


@pytest.mark.timing
@pytest.mark.gloo
def test_neural_round_trip(neural_bundle, folders, tmp_path):
    path = neural_bundle.save(tmp_path / "m.pt")
    loaded = CostModels.load(path)
    assert type(loaded.compute) is NeuralComputeModel and type(loaded.comm) is NeuralCommModel
    assert loaded.batch_size == neural_bundle.batch_size and loaded.hardware == neural_bundle.hardware
    for before, after in zip(predictions(neural_bundle, folders), predictions(loaded, folders)):
        np.testing.assert_allclose(before, after, rtol=1e-6)
    assert path.stat().st_size < 5 << 20


@pytest.mark.timing
@pytest.mark.gloo
def test_reference_models_round_trip(folders, tmp_path):
    data = load_compute(folders["compute"])
    groups, meta = load_comm([folders["comm2"]])
    for compute, comm in ((TreeComputeModel(seed=0), TreeCommModel(meta["batch_size"])),
                          (AnalyticComputeModel(data.batch_size), AnalyticCommModel(meta["batch_size"]))):
        bundle = CostModels(compute.fit(data.sets, data.costs_ms), comm.fit(groups), data.batch_size)
        loaded = CostModels.load(bundle.save(tmp_path / f"{compute.name}.pt"))
        for before, after in zip(predictions(bundle, folders), predictions(loaded, folders)):
            np.testing.assert_allclose(before, after, rtol=1e-9)


def test_other_schema_version_is_refused(small_bundle, tmp_path):
    path = small_bundle.save(tmp_path / "m.pt")
    payload = torch.load(path, weights_only=True)
    payload["feature_schema_version"] += 1
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(NeuroShardError, match="feature schema version"):
        CostModels.load(path)
    path.write_text("not a checkpoint")
    with pytest.raises(NeuroShardError, match="not a cost-model checkpoint"):
        CostModels.load(path)


def test_writes_are_atomic(small_bundle, tmp_path):
    path = small_bundle.save(tmp_path / "m.pt")
    original = path.read_bytes()
    analytic = CostModels(AnalyticComputeModel(), AnalyticCommModel(), 4096)
    analytic.save(path)  # replaced in one rename: no temporary file left behind
    assert CostModels.load(path).compute.name == "analytic"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]
    path.write_bytes(original)

    class Unsaveable(AnalyticComputeModel):
        pass

    with pytest.raises(NeuroShardError):
        CostModels(Unsaveable(), AnalyticCommModel(), 4096).save(path)
    assert path.read_bytes() == original  # a failed save leaves the old file whole


def test_load_cost_models_without_and_with_checkpoint(small_bundle, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(costmodels, "DEFAULT_CHECKPOINT", tmp_path / "missing.pt")
    with caplog.at_level(logging.WARNING):
        fallback = load_cost_models()
    assert isinstance(fallback.compute, AnalyticComputeModel) and "analytic" in caplog.text
    assert fallback.comm_for(128).predict_backward(np.full((1, 128), 64.0)).shape == (1, 128)
    path = small_bundle.save(tmp_path / "cpu-default.pt")
    monkeypatch.setattr(costmodels, "DEFAULT_CHECKPOINT", path)
    assert isinstance(load_cost_models().compute, NeuralComputeModel)
    assert isinstance(load_cost_models(path).comm, NeuralCommModel)
    with pytest.raises(NeuroShardError, match="no such"):
        load_cost_models(tmp_path / "nope.pt")


def test_shipped_checkpoint_loads_if_present():
    if not costmodels.DEFAULT_CHECKPOINT.exists():
        pytest.skip("no shipped checkpoint in this tree")
    models = load_cost_models()
    assert models.hardware and models.metrics
    sets = [np.array([[64, 16.0, 2.0, 24.0, 0.5] + [1.0] + [0.0] * 16], dtype=np.float32)]
    assert np.isfinite(models.compute.predict(sets)).all()


@pytest.mark.timing
@pytest.mark.gloo
def test_pretrain_command(folders, tmp_path):
    out = tmp_path / "model.pt"
    done = run_cli("pretrain", "--data", folders["compute"], "--comm-data", folders["comm2"], "--out", out,
                   "--epochs", "30", "--test-tables", "0.3")
    assert done.returncode == 0, done.stderr
    for name in ("neural", "tree", "analytic", "compute", "comm_fwd", "gmae", "pair_accuracy"):
        assert name in done.stdout
    assert out.exists() and out.with_suffix(".parity.png").stat().st_size > 0
    models = CostModels.load(out)
    assert "compute/neural" in models.metrics and models.data_summary["compute"]["test_sets"] > 0
    shown = run_cli("costmodel", "show", out)
    assert shown.returncode == 0 and "NeuralComputeModel" in shown.stdout
    missing = run_cli("pretrain", "--data", tmp_path / "nothing", "--out", tmp_path / "x.pt")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "error" in missing.stderr
