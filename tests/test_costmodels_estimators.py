"""Cost models as scikit-learn estimators: parameters, cloning, fitted state, and checkpoints that are data.

Shard sets are the feature sets of ``tests/data/cpu-default-v1.predictions.json`` (dlrm-2021 shards),
costed by the shipped model of that file: no kernel is timed here.
"""
from __future__ import annotations

import inspect
import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from sklearn.base import clone
from sklearn.ensemble import HistGradientBoostingRegressor

import neuroshard.costmodels as costmodels
from neuroshard.costmodels import CostModels
from neuroshard.costmodels.analytic import AnalyticCommModel, AnalyticComputeModel
from neuroshard.costmodels.base import CommSamples
from neuroshard.costmodels.neural import NeuralCommModel, NeuralComputeModel
from neuroshard.costmodels.tree import TreeArrays, TreeCommModel, TreeComputeModel, set_aggregates
from neuroshard.errors import NeuroShardError

V1_CHECKPOINT = Path(__file__).parent / "data" / "cpu-default-v1.pt"


@pytest.fixture(scope="module")
def measured(reference_data) -> tuple[list[np.ndarray], np.ndarray, list[CommSamples]]:
    """Shard sets with costs (the reference predictions, 5% noise) and comm samples at 2 and 3 devices."""
    rng = np.random.default_rng(0)
    sets = reference_data["sets"]
    costs = reference_data["compute_ms"] * rng.lognormal(0.0, 0.05, len(sets))
    groups = []
    for d in (2, 3):
        widths = rng.integers(1, 512, size=(60, d)).astype(np.float64)
        skews = rng.random((60, d))
        reduce_width = np.where(rng.random(60) < 0.5, rng.integers(1, 128, 60), 0).astype(np.float64)
        groups.append(CommSamples(widths, skews, 0.2 + widths * 3e-3 + skews.max(1, keepdims=True) - skews,
                                  0.2 + widths * 2e-3, reduce_width, 0.1 + reduce_width[:, None] * 1e-3 + 0 * widths))
    return sets, costs, groups


def _kinds():
    return [(NeuralComputeModel(hidden=16, depth=2, epochs=15, patience=5), NeuralCommModel(epochs=15, hidden=8)),
            (TreeComputeModel(max_iter=40), TreeCommModel(max_iter=40)),
            (AnalyticComputeModel(), AnalyticCommModel())]


@pytest.fixture(scope="module")
def fitted(measured) -> list[CostModels]:
    sets, costs, groups = measured
    return [CostModels(compute.fit(sets, costs), comm.fit(groups), 4096, name=compute.name) for compute, comm in _kinds()]


def _predictions(models: CostModels, sets) -> list[np.ndarray]:
    widths, skews = np.array([[64.0, 128.0, 0.0], [8.0, 300.0, 40.0]]), np.array([[0.0, 1.5, 0.3], [0.2, 0.0, 0.0]])
    comm = models.comm_for(3)
    return [models.compute.predict(sets), comm.predict_forward(widths, skews), comm.predict_backward(widths),
            comm.predict_reduce([32.0, 0.0])]


def test_hyper_parameters_are_the_constructor_arguments_and_clone_unfitted(fitted):
    for models in fitted:
        for model in (models.compute, models.comm):
            params = model.get_params()
            assert set(params) == set(inspect.signature(type(model).__init__).parameters) - {"self"}
            copy = clone(model)  # sklearn checks every parameter is stored as given
            assert type(copy) is type(model) and copy.get_params() == params
            assert [k for k in vars(model) if k.endswith("_")], type(model).__name__  # fitted state...
            assert not [k for k in vars(copy) if k.endswith("_")], type(model).__name__  # ...is not a parameter
            name, value = next(iter(params.items()))
            assert getattr(copy.set_params(**{name: value}), name) is value
    neural = fitted[0].compute
    assert clone(neural).set_params(hidden=24).get_params()["hidden"] == 24
    with pytest.raises(NeuroShardError, match="not trained"):
        clone(neural).predict([np.zeros((1, 22), np.float32)])


def test_normalisation_is_buffers_of_the_networks(fitted):
    compute, comm = fitted[0].compute, fitted[0].comm
    state = compute.net_.state_dict()
    for name in ("shards.mean", "shards.std", "shards.lo", "shards.hi", "prior.mean", "residual_mean", "residual_lo"):
        assert name in state and dict(compute.net_.named_buffers())[name] is not None
    assert {"inputs.mean", "inputs.std", "inputs.lo", "inputs.hi"} <= set(comm.fwd_.state_dict())
    assert sorted(compute.state_dict()) == ["hparams", "net", "prior", "val_loss"]


def test_every_kind_saves_data_that_loads_with_weights_only(fitted, measured, tmp_path):
    sets = measured[0]
    for models in fitted:
        path = models.save(tmp_path / f"{models.name}.pt")
        payload = torch.load(path, weights_only=True)  # tensors, numbers, strings, lists, dicts: no code
        assert payload["format"] == "neuroshard.costmodels/v2"
        loaded = CostModels.load(path)
        assert type(loaded.compute) is type(models.compute) and loaded.compute.get_params() == models.compute.get_params()
        for before, after in zip(_predictions(models, sets), _predictions(loaded, sets)):
            np.testing.assert_allclose(after, before, rtol=1e-12)


def test_tree_arrays_predict_what_scikit_learn_predicts(measured):
    sets, costs, _ = measured
    x = set_aggregates(sets)
    model = HistGradientBoostingRegressor(max_iter=80, random_state=0).fit(x, np.log(costs))
    x[3, 5] = np.nan  # a missing value follows the learned side
    np.testing.assert_allclose(TreeArrays.from_sklearn(model).predict(x), model.predict(x), rtol=1e-12)


class _Tripwire:
    """Unpickling this touches a file: a checkpoint that unpickles leaves a mark."""

    def __init__(self, mark: Path):
        self.mark = mark

    def __reduce__(self):
        return (Path.touch, (self.mark,))


def test_pickle_bearing_checkpoints_are_refused_unopened(tmp_path):
    mark = tmp_path / "unpickled"
    payload = torch.load(V1_CHECKPOINT, weights_only=True)
    # A v1 tree model: its trees were a pickle inside a byte tensor.
    payload["compute"] = {"class": "TreeComputeModel", "state": {
        "seed": 0, "params": {}, "model": torch.frombuffer(bytearray(pickle.dumps(_Tripwire(mark))), dtype=torch.uint8)}}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    (tmp_path / "tree-v1.pt").write_bytes(buffer.getvalue())
    with pytest.raises(NeuroShardError, match="tree-v1.pt: TreeComputeModel: .* pickled scikit-learn trees"):
        CostModels.load(tmp_path / "tree-v1.pt")
    # A tampered file whose objects are not plain data.
    torch.save({**payload, "metrics": {"x": _Tripwire(mark)}}, tmp_path / "tampered.pt")
    with pytest.raises(NeuroShardError, match="not a cost-model checkpoint"):
        CostModels.load(tmp_path / "tampered.pt")
    done = run_cli("costmodel", "show", tmp_path / "tampered.pt")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert not mark.exists()


def test_tampered_tree_arrays_are_refused(fitted, tmp_path):
    path = fitted[1].save(tmp_path / "tree.pt")
    payload = torch.load(path, weights_only=True)
    payload["compute"]["state"]["trees"]["left"][0] = 10**9
    torch.save(payload, path)
    with pytest.raises(NeuroShardError, match="TreeComputeModel: malformed model state"):
        CostModels.load(path)


def _reference_predictions_match(models: CostModels, reference: dict) -> None:
    np.testing.assert_allclose(models.compute.predict(reference["sets"]), reference["compute_ms"], rtol=1e-6)
    for d, ref in reference["raw"]["comm"].items():
        comm = models.comm_for(int(d))
        widths, skews, reduce_width = (np.asarray(ref[k]) for k in ("widths", "skews_ms", "reduce_width"))
        np.testing.assert_allclose(comm.predict_forward(widths, skews), ref["fwd_ms"], rtol=1e-6)
        np.testing.assert_allclose(comm.predict_backward(widths), ref["bwd_ms"], rtol=1e-6)
        np.testing.assert_allclose(comm.predict_reduce(reduce_width), ref["reduce_ms"], rtol=1e-6)


def test_v1_checkpoint_predicts_what_it_did_before(tmp_path, reference_data):
    """The shipped checkpoint as it was in format v1, read and re-saved: the predictions the code of v1 made."""
    models = CostModels.load(V1_CHECKPOINT)
    _reference_predictions_match(models, reference_data)
    _reference_predictions_match(CostModels.load(models.save(tmp_path / "v2.pt")), reference_data)


def test_shipped_checkpoint_is_v2_and_round_trips(tmp_path, reference_data):
    path = costmodels.DEFAULT_CHECKPOINT
    if not path.exists():
        pytest.skip("no shipped checkpoint in this tree")
    assert torch.load(path, weights_only=True)["format"] == "neuroshard.costmodels/v2"
    models = CostModels.load(path)
    sets = reference_data["sets"]
    again = CostModels.load(models.save(tmp_path / "again.pt"))
    for before, after in zip(_predictions(models, sets), _predictions(again, sets)):
        np.testing.assert_array_equal(after, before)


def test_a_state_that_is_not_data_is_not_written(fitted, tmp_path):
    class Odd(AnalyticComputeModel):  # a fitted state holding an object: it would need unpickling
        def fitted_state(self) -> dict:
            return {"coef": Path("x")}

    Odd.__name__ = "AnalyticComputeModel"
    with pytest.raises(NeuroShardError, match="not plain data"):
        CostModels(Odd(), fitted[2].comm, 4096).save(tmp_path / "odd.pt")
    assert not (tmp_path / "odd.pt").exists()


def test_shared_shards_are_encoded_once_and_predict_what_padded_sets_do(shipped_models):
    """``NeuralComputeModel.predict`` encodes each distinct shard of a chunk once
    (``SetNet.forward_shared``); it predicts what the padded forward pass (the one training
    uses) predicts for the same sets, including repeated shards within a set and empty sets."""
    import torch

    from neuroshard.costmodels.features import shard_set_features
    from neuroshard.datasets.synthetic import generate
    tables = generate("dlrm-2021", 40, seed=3).tables
    rng = np.random.default_rng(4)
    sets = [shard_set_features([tables[i] for i in rng.choice(40, rng.integers(1, 10))], 4096) for _ in range(500)]
    sets.append(shard_set_features([], 4096))
    for member in shipped_models.compute.members_:
        shared = member.predict(sets)
        with torch.no_grad():
            padded, mask, log_prior = member._inputs(sets)
            padded_forward = np.exp(log_prior.numpy() + member.net_(padded, mask, log_prior).numpy())
        assert np.allclose(shared, padded_forward, rtol=1e-5, atol=0), np.max(np.abs(shared / padded_forward - 1))
