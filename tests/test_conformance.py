"""Conformance: every registered search algorithm and every cost-model class keeps the
contract its interface states (``search.registry.SearchAlgorithm``, ``costmodels.base``).

A new algorithm or cost model is tested here as soon as it is registered: the algorithms
come from ``ALGORITHMS``, the cost models from the classes the package defines."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil

import numpy as np
import pytest
from conftest import algorithm_params
from sklearn.base import clone

import neuroshard.costmodels
from neuroshard.costmodels.analytic import AnalyticCommModel, AnalyticComputeModel
from neuroshard.costmodels.base import CommCostModel, ComputeCostModel, CostModels
from neuroshard.costmodels.checkpoint import MODEL_CLASSES
from neuroshard.errors import NeuroShardError
from neuroshard.search.api import search_plan
from neuroshard.search.registry import ALGORITHMS, SIMULATED_ALGORITHMS, get_algorithm, make_params
from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet

# ---------------------------------------------------------------- algorithms
#: what an algorithm needs beyond the package's dependencies (the module to import)
OPTIONAL = {"torchrec": "torchrec.distributed.planner", "bayes": "optuna"}
#: small parameters, so every search takes well under a second
PARAMS = {"neuroshard": {"beam_width": 2, "depth": 4, "top_n": 2, "grid_size": 5},
          "bayes": {"n_trials": 8, "batch": 4}}
DEVICES = 4
#: 8 tables of 500-5,400 rows, widths 16-64 (3.6 MB in fp32); every table fits one device
TASK = TableSet("conformance", [Table(f"t{i}", 500 + 700 * i, (16, 32, 64)[i % 3], 1.0 + 2.5 * (i % 4),
                                      {"zipf_alpha": 0.8 + 0.05 * i}) for i in range(8)], 1024)


def _memory(name: str) -> int:
    """Per-device memory: twice the even share (TorchRec's planner also counts optimizer
    state and buffers, about 3x the weights: ten times the share for it)."""
    fill = 0.1 if name == "torchrec" else 0.5
    return int(TASK.total_bytes() / (fill * DEVICES))


def _coverage(tables: TableSet, shards) -> dict[str, np.ndarray]:
    """How many times each (row, column) of each table is held by ``shards`` (objects with
    table, row_offset, num_rows, col_offset, num_cols; ``table`` a name or an index)."""
    names = [t.name for t in tables]
    counts = {t.name: np.zeros((t.num_embeddings, t.embedding_dim), np.int32) for t in tables}
    for s in shards:
        name = names[s.table] if isinstance(s.table, (int, np.integer)) else s.table
        counts[name][s.row_offset:s.row_offset + s.num_rows, s.col_offset:s.col_offset + s.num_cols] += 1
    return counts


def _json(value):
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_registered_algorithm_has_the_interface(name):
    """Name, parameters dataclass with defaults (or none), one ``search(sim, memory_bytes,
    params, seed)``, unknown parameters refused: the hardware-timed ones included (nothing is run)."""
    algorithm = get_algorithm(name)
    assert algorithm.name == name
    assert list(inspect.signature(algorithm.search).parameters) == ["sim", "memory_bytes", "params", "seed"]
    params = make_params(algorithm, {})
    if algorithm.params_type is None:
        assert params is None
    else:
        assert dataclasses.is_dataclass(algorithm.params_type) and isinstance(params, algorithm.params_type)
        assert all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                   for f in dataclasses.fields(algorithm.params_type)), "every parameter has a default"
    with pytest.raises(NeuroShardError, match=f"'{name}'"):
        make_params(algorithm, {"no_such_parameter": 1})


@pytest.mark.parametrize("name", algorithm_params(SIMULATED_ALGORITHMS))
def test_every_simulated_algorithm_finds_a_plan_that_covers_every_table_once_and_fits(name, analytic_models):
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name], reason=f"algorithm '{name}' needs {OPTIONAL[name].split('.')[0]}")
    memory, params = _memory(name), PARAMS.get(name, {})
    algorithm = get_algorithm(name)

    # the algorithm itself: a placement of pieces that tile every table, within memory
    sim = Simulator(TASK, DEVICES, analytic_models)
    placement = algorithm.search(sim, memory, make_params(algorithm, params), 0)
    devices = np.asarray(placement.devices)
    assert len(placement.pieces) == len(devices) >= len(TASK)
    assert ((devices >= 0) & (devices < DEVICES)).all()
    for table, counts in _coverage(TASK, placement.pieces).items():
        assert (counts == 1).all(), f"{name}: table {table} is not covered exactly once"
    used = np.bincount(devices, weights=[p.size_bytes(4) for p in placement.pieces], minlength=DEVICES)
    assert used.max() <= memory
    # its cost is what the simulator says of it, and it reports its parameters
    assert placement.cost_ms == pytest.approx(float(sim.evaluate(placement.pieces, devices[None, :]).max_ms[0]))
    assert placement.details["simulated_cost_ms"] == pytest.approx(placement.cost_ms)
    assert isinstance(placement.details["parameters"], dict)

    # through search_plan(): a valid plan, each table's rows and columns held exactly once, memory by hand
    plan = search_plan(TASK, devices=DEVICES, memory=memory, algorithm=name, cost_models=analytic_models, seed=0,
                       **params)
    assert plan.problems() == []
    assert plan.num_devices == DEVICES and [t.name for t in plan.tables] == [t.name for t in TASK]
    for table, counts in _coverage(TASK, plan.shards).items():
        assert (counts == 1).all(), f"{name}: table {table} is not covered exactly once in the plan"
    by_hand = [sum(s.num_rows * s.num_cols * 4 for s in plan.shards if s.device == d) for d in range(DEVICES)]
    assert plan.memory_used_bytes() == by_hand and max(by_hand) <= memory == plan.device_memory_bytes
    assert plan.provenance["algorithm"] == name and plan.provenance["cost_model"] == analytic_models.name
    assert plan.provenance["parameters"] == _json(placement.details["parameters"])
    assert plan.estimate["max_device_cost_ms"] == pytest.approx(max(plan.estimate["per_device_cost_ms"]), rel=1e-6)
    # the same seed, the same plan
    again = search_plan(TASK, devices=DEVICES, memory=memory, algorithm=name, cost_models=analytic_models, seed=0,
                        **params)
    assert again.shards == plan.shards


# --------------------------------------------------------------- cost models
def _package_model_classes() -> dict[str, type]:
    """Every concrete compute or communication model class the package defines (its
    ``costmodels`` modules imported)."""
    for module in pkgutil.walk_packages(neuroshard.costmodels.__path__, "neuroshard.costmodels."):
        importlib.import_module(module.name)
    found, todo = {}, [ComputeCostModel, CommCostModel]
    while todo:
        for cls in todo.pop().__subclasses__():
            todo.append(cls)
            if cls.__module__.startswith("neuroshard.") and not inspect.isabstract(cls):
                found[cls.__name__] = cls
    return found


CLASSES = _package_model_classes()
#: small hyper-parameters (fast fits); a class not listed is built with its defaults
SMALL = {"NeuralComputeModel": dict(hidden=16, depth=2, epochs=10, patience=5),
         "NeuralCommModel": dict(hidden=8, epochs=10, patience=5),
         "TreeComputeModel": dict(max_iter=30),
         "TreeCommModel": dict(max_iter=30),
         "EnsembleComputeModel": dict(size=2, member_params=dict(hidden=16, depth=2, epochs=10, patience=5))}
COMPUTE = sorted(n for n, c in CLASSES.items() if issubclass(c, ComputeCostModel))
COMM = sorted(n for n, c in CLASSES.items() if issubclass(c, CommCostModel))


def test_every_cost_model_class_can_be_checkpointed():
    """The checkpoint's class table names exactly the classes the package defines."""
    assert set(CLASSES) == set(MODEL_CLASSES)
    assert {"AnalyticComputeModel", "NeuralComputeModel", "TreeComputeModel", "EnsembleComputeModel"} <= set(COMPUTE)
    assert {"AnalyticCommModel", "NeuralCommModel", "TreeCommModel"} <= set(COMM)


def _check_hyper_parameters(model) -> None:
    params = model.get_params()
    assert set(params) == set(inspect.signature(type(model).__init__).parameters) - {"self"}
    copy = clone(model)  # scikit-learn checks every parameter is stored as given
    assert type(copy) is type(model) and copy.get_params() == params


@pytest.mark.parametrize("name", COMPUTE)
def test_every_compute_model_fits_predicts_and_round_trips(name, reference_data, tmp_path):
    sets, costs = reference_data["sets"], reference_data["compute_ms"]
    model = CLASSES[name](**SMALL.get(name, {}))
    _check_hyper_parameters(model)
    assert model.fit(sets, costs) is model
    predicted = model.predict(sets)
    assert predicted.shape == (len(sets),) and np.isfinite(predicted).all() and (predicted > 0).all()
    assert set(model.evaluate(sets, costs)) >= {"gmae", "mape", "kendall_tau", "pair_accuracy"}
    # the fitted state is plain data that rebuilds the model...
    rebuilt = type(model).from_state_dict(model.state_dict())
    np.testing.assert_allclose(rebuilt.predict(sets), predicted, rtol=1e-12)
    # ...and goes through a checkpoint file and back
    path = CostModels(model, AnalyticCommModel(), 4096, name=name).save(tmp_path / f"{name}.pt")
    loaded = CostModels.load(path).compute
    assert type(loaded) is type(model) and loaded.get_params() == model.get_params()
    np.testing.assert_allclose(loaded.predict(sets), predicted, rtol=1e-12)


@pytest.mark.parametrize("name", COMM)
def test_every_comm_model_fits_predicts_and_round_trips(name, reference_data, tmp_path):
    groups = reference_data["comm"]  # 2, 3, 4, 8 and 16 devices
    model = CLASSES[name](**SMALL.get(name, {}))
    _check_hyper_parameters(model)
    assert model.fit(groups) is model
    assert set(model.evaluate(groups)) >= {"fwd", "bwd"}
    path = CostModels(AnalyticComputeModel(), model, 4096, name=name).save(tmp_path / f"{name}.pt")
    loaded = CostModels.load(path).comm
    assert type(loaded) is type(model) and loaded.get_params() == model.get_params()
    rng = np.random.default_rng(0)
    for d in (2, 5, 16):  # 5: a device count it never saw
        widths = rng.integers(1, 256, size=(4, d)).astype(np.float64)
        skews = rng.random((4, d))
        reduce_width = np.array([0.0, 8.0, 32.0, 128.0])
        for predict in (lambda m: m.predict_forward(widths, skews), lambda m: m.predict_backward(widths)):
            out = predict(model)
            assert out.shape == (4, d) and np.isfinite(out).all() and (out > 0).all()
            np.testing.assert_allclose(predict(loaded), out, rtol=1e-12)
        reduce = model.predict_reduce(reduce_width, d)
        assert reduce.shape == (4,) and reduce[0] == 0 and (reduce[1:] > 0).all()
        np.testing.assert_allclose(loaded.predict_reduce(reduce_width, d), reduce, rtol=1e-12)
