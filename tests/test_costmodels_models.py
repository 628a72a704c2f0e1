"""Compute and communication models fitted on small real measurements (real kernels, real gloo).

The measured folders (conftest's ``measured_folders``) are made once per session by the
measurement code itself."""
from __future__ import annotations

import numpy as np
import pytest

from neuroshard.costmodels.analytic import AnalyticCommModel, AnalyticComputeModel
from neuroshard.costmodels.base import CommSamples
from neuroshard.costmodels.metrics import gmae
from neuroshard.costmodels.neural import NeuralCommModel, NeuralComputeModel
from neuroshard.costmodels.pretrain import ComputeData, load_comm, load_compute, split_comm
from neuroshard.costmodels.tree import TreeCommModel, TreeComputeModel


@pytest.fixture(scope="module")
def compute_data(measured_folders) -> ComputeData:
    return load_compute(measured_folders["compute"])


@pytest.fixture(scope="module")
def comm_groups(measured_folders) -> list[CommSamples]:
    return load_comm([measured_folders["comm2"]])[0]


def random_split(data: ComputeData, seed: int = 0) -> tuple[ComputeData, ComputeData]:
    order = np.random.default_rng(seed).permutation(len(data))
    return data.subset(order[50:]), data.subset(order[:50])


@pytest.fixture(scope="module")
def neural_compute(compute_data) -> NeuralComputeModel:
    train, _ = random_split(compute_data)
    return NeuralComputeModel(hidden=64, depth=2, lr=1e-2, epochs=300, patience=60, seed=0).fit(train.sets, train.costs_ms)


@pytest.mark.timing
@pytest.mark.gloo
def test_loaded_data_matches_the_records(compute_data):
    assert len(compute_data) == 200 and compute_data.batch_size == 1024
    assert all(s.ndim == 2 and 1 <= len(s) <= 4 for s in compute_data.sets)
    assert all(t <= {f"t{i}" for i in range(14)} for t in compute_data.tables)
    assert (compute_data.costs_ms > 0).all()


@pytest.mark.timing
@pytest.mark.gloo
def test_neural_compute_learns(compute_data, neural_compute):
    """On sets it never saw, far better than the best constant (the geometric mean)."""
    train, test = random_split(compute_data)
    constant = np.full(len(test), np.exp(np.log(train.costs_ms).mean()))
    model_err, constant_err = gmae(neural_compute.predict(test.sets), test.costs_ms), gmae(constant, test.costs_ms)
    assert model_err < 0.6 * constant_err, (model_err, constant_err)
    metrics = neural_compute.evaluate(test.sets, test.costs_ms)
    assert metrics["kendall_tau"] > 0.6 and metrics["pair_accuracy"] > 0.7


@pytest.mark.timing
@pytest.mark.gloo
def test_neural_compute_predicts_many_sets_in_one_call(compute_data, neural_compute):
    sets = compute_data.sets * 20  # 4000 sets of mixed sizes, one batched call
    many = neural_compute.predict(sets)
    one_by_one = np.array([neural_compute.predict([s])[0] for s in compute_data.sets[:20]])
    assert many.shape == (4000,) and np.allclose(many[:20], one_by_one, rtol=1e-5)
    assert np.allclose(many[:200], many[200:400])
    assert neural_compute.predict([]).shape == (0,)


@pytest.mark.timing
@pytest.mark.gloo
def test_reference_compute_models_fit_and_predict(compute_data):
    train, test = random_split(compute_data)
    for model in (TreeComputeModel(seed=0), AnalyticComputeModel(batch_size=1024)):
        pred = model.fit(train.sets, train.costs_ms).predict(test.sets)
        assert pred.shape == (len(test),) and np.isfinite(pred).all() and (pred > 0).all()
        assert set(model.evaluate(test.sets, test.costs_ms)) == {"gmae", "mape", "kendall_tau", "pair_accuracy", "n"}


@pytest.mark.timing
@pytest.mark.gloo
def test_analytic_compute_fit_beats_its_defaults(compute_data):
    model = AnalyticComputeModel(batch_size=1024)
    before = gmae(model.predict(compute_data.sets), compute_data.costs_ms)
    after = gmae(model.fit(compute_data.sets, compute_data.costs_ms).predict(compute_data.sets), compute_data.costs_ms)
    assert after < before and (model.coef_ >= 0).all()


def test_analytic_comm_defaults_follow_bytes_and_waiting():
    model = AnalyticCommModel(batch_size=4096)
    widths = np.array([[64.0, 64.0], [256.0, 256.0]])
    base = model.predict_forward(widths, np.zeros((2, 2)))
    assert (base[1] > base[0]).all()
    waited = model.predict_forward(widths, np.array([[0.0, 5.0], [0.0, 5.0]]))
    assert np.allclose(waited[:, 0] - base[:, 0], 5.0) and np.allclose(waited[:, 1], base[:, 1])
    assert model.predict_reduce(np.array([0.0, 64.0]), 4)[0] == 0.0 and model.predict_reduce(np.array([64.0]), 4)[0] > 0


@pytest.mark.timing
@pytest.mark.gloo
@pytest.mark.parametrize("cls", [NeuralCommModel, TreeCommModel, AnalyticCommModel])
def test_comm_models_fit_and_answer_any_device_count(comm_groups, cls):
    train, test = split_comm(comm_groups, 0.25, seed=0)
    model = cls(512, epochs=60, seed=0) if cls is NeuralCommModel else cls(512)
    model.fit(train)
    metrics = model.evaluate(test)
    assert set(metrics) >= {"fwd", "bwd"} and all(np.isfinite(m["gmae"]) for m in metrics.values())
    for d in (2, 3, 128):
        widths = np.full((3, d), 64.0)
        skews = np.zeros((3, d))
        for out in (model.predict_forward(widths, skews), model.predict_backward(widths)):
            assert out.shape == (3, d) and np.isfinite(out).all() and (out > 0).all()
        assert model.predict_reduce(np.array([0.0, 32.0, 64.0]), d).shape == (3,)
