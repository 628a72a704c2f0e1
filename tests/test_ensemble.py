"""The ensemble compute model: members, spread, checkpoint, and a search that charges the spread."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from sklearn.base import clone

from neuroshard import shard
from neuroshard.costmodels import load_cost_models
from neuroshard.costmodels.base import CostModels
from neuroshard.costmodels.ensemble import EnsembleComputeModel, work_cost_models, working_set_log2
from neuroshard.costmodels.work import WorkComputeModel, work_features
from neuroshard.errors import NeuroShardError
from neuroshard.measured.calibrate import calibrate
from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet
from neuroshard.types import whole_pieces

TABLES = TableSet("ens", [Table(f"t{i}", 2_000 * (i + 1), (16, 32, 64)[i % 3], 0.5 + 3 * (i % 5),
                                {"zipf_alpha": 0.8 + 0.05 * i}) for i in range(14)], 4096)


@pytest.fixture(scope="module")
def data(shipped_models):
    """Random shard sets of TABLES' pieces, costed by the shipped model with 5% noise."""
    sim = Simulator(TABLES, 1, shipped_models)
    ids = sim.piece_ids([h for p in whole_pieces(TABLES) for h in (p, *p.halve_cols())])
    rng = np.random.default_rng(0)
    sets = [sim.features_of(rng.choice(ids, size=int(rng.integers(1, 8)), replace=False)) for _ in range(160)]
    costs = shipped_models.compute.predict(sets) * rng.lognormal(0.0, 0.05, len(sets))
    return sets, costs


@pytest.fixture(scope="module")
def ensemble(data):
    sets, costs = data
    return EnsembleComputeModel(3, member_params=dict(epochs=40, patience=10, hidden=32, depth=2)).fit(sets, costs)


def test_members_differ_and_predict_is_their_geometric_mean(ensemble, data):
    sets, costs = data
    members = ensemble.predict_members(sets)
    assert members.shape == (3, len(sets))
    assert not np.allclose(members[0], members[1])  # other seeds, other bootstrap resamples
    mean, spread = ensemble.predict_with_spread(sets)
    assert np.allclose(mean, np.exp(np.log(members).mean(axis=0)))
    assert np.allclose(spread, np.log(members).std(axis=0)) and np.all(spread >= 0)
    assert np.median(np.abs(np.log(mean / costs))) < 0.5


def test_ensemble_needs_two_members_and_clones(data):
    with pytest.raises(NeuroShardError, match="at least 2 members"):
        EnsembleComputeModel(1).fit(*data)
    model = EnsembleComputeModel(4, member_params={"hidden": 16})
    assert clone(model).get_params() == model.get_params()


def test_checkpoint_round_trip_loads_weights_only(ensemble, shipped_models, data, tmp_path):
    sets, _ = data
    path = CostModels(ensemble, shipped_models.comm, shipped_models.batch_size, name="ens").save(tmp_path / "ens.pt")
    torch.load(path, weights_only=True)  # data only: no code runs on load
    loaded = load_cost_models(path)
    assert isinstance(loaded.compute, EnsembleComputeModel) and loaded.compute.size == 3
    assert np.allclose(loaded.compute.predict_members(sets), ensemble.predict_members(sets), rtol=1e-6)


def test_search_charges_the_spread_and_the_plan_reports_the_mean(ensemble, shipped_models):
    models = CostModels(ensemble, shipped_models.comm, shipped_models.batch_size, name="ens")
    sim = Simulator(TABLES, 3, models)
    single = CostModels(ensemble.members_[0], shipped_models.comm, shipped_models.batch_size, name="one")
    assert sim.risk == 1.0 and Simulator(TABLES, 3, single).risk == 0.0
    ids = sim.piece_ids(whole_pieces(TABLES))
    sets = [tuple(sorted(ids[i::3].tolist())) for i in range(3)]
    mean = sim.set_costs_ms(sets, risk=0.0)
    charged = sim.set_costs_ms(sets)
    spread = ensemble.spread([sim.features_of(np.array(s)) for s in sets])
    assert np.allclose(charged, mean * np.exp(spread))
    plan = shard(TABLES, devices=3, memory="64MiB", cost_models=models)
    assert plan.provenance["risk"] == 1.0
    again = Simulator(TABLES, 3, models).evaluate_plan(plan)  # scoring reports the mean
    assert plan.estimate["max_device_cost_ms"] == pytest.approx(float(again.max_ms[0]), rel=1e-6)


@pytest.mark.timing
def test_calibration_fine_tunes_every_member_or_keeps_the_pretrained(ensemble, shipped_models):
    models = CostModels(ensemble, shipped_models.comm, shipped_models.batch_size, name="ens")
    small = TableSet("ens-small", TABLES.tables[:6], 4096)
    calibrated, report = calibrate(small, models, devices=2, sets=8, epochs=5)
    assert isinstance(calibrated.compute, EnsembleComputeModel)
    # kept: a copy that predicts as the pre-trained ensemble (no corrections fitted); the work model joins it either way
    # (an ensemble built before its first correction has no set_size_coef_: read as the model reads it)
    assert report.kept_pretrained == (getattr(calibrated.compute, "set_size_coef_", None) is None)
    assert calibrated.compute is not ensemble and calibrated.compute.work_model_ is not None
    assert report.kept_pretrained == (report.gmae_after > report.gmae_before)


def test_set_size_correction_learns_a_crowding_curve_and_survives_a_checkpoint(ensemble, data, tmp_path):
    """Costs that rise with the number of shards beyond what the members predict are learnt by
    the set-size correction (fitted on measured sets), and a checkpoint keeps it."""
    sets, _ = data
    model = copy.deepcopy(ensemble)
    sizes = np.array([len(s) for s in sets])
    crowded = model.predict(sets) * np.exp(0.15 * np.maximum(0, sizes - 3))  # 16% more per shard past 3
    before = np.abs(np.log(model.predict(sets) / crowded))
    model.fit_set_size_correction(sets, crowded)
    after = np.abs(np.log(model.predict(sets) / crowded))
    assert after.mean() < 0.5 * before.mean()
    assert model.predict([s for s in sets if len(s) >= 6]).mean() > ensemble.predict([s for s in sets if len(s) >= 6]).mean()
    bundle = CostModels(model, load_cost_models().comm, 4096, name="with-correction")
    loaded = CostModels.load(bundle.save(tmp_path / "c.pt")).compute
    np.testing.assert_allclose(loaded.predict(sets[:20]), model.predict(sets[:20]), rtol=1e-5)
    model.fine_tune(sets[:40], crowded[:40], sets[40:50], crowded[40:50], epochs=2)
    assert model.set_size_coef_ is None  # new members: the old correction no longer applies


def test_set_level_head_learns_the_working_set_beyond_the_cache_and_survives_a_checkpoint(ensemble, data, tmp_path):
    """Pre-training's set-level head: sets whose weights outgrow the cache cost more than the
    members predict; the head (set size + working set, no shard correction) learns it from the
    sets alone, a checkpoint keeps it, and a head without a shard correction is told apart."""
    sets, _ = data
    model = copy.deepcopy(ensemble)
    knee = int(np.median([np.exp2(working_set_log2([s], 1, 1_000_000)[0]) for s in sets]))
    beyond = working_set_log2(sets, knee, 1_000_000)
    assert (beyond > 0).any() and (beyond == 0).any()
    slow = model.predict(sets) * np.exp(0.4 * beyond)  # 1.3x per doubling of the working set past the knee
    before = np.abs(np.log(model.predict(sets) / slow)).mean()
    model.fit_set_head(sets, slow, knee, 1_000_000)
    assert model.shard_refs_ is None and len(model.set_size_coef_) == 5
    assert np.abs(np.log(model.predict(sets) / slow)).mean() < 0.5 * before
    bundle = CostModels(model, load_cost_models().comm, 4096, name="with-set-head")
    loaded = CostModels.load(bundle.save(tmp_path / "h.pt")).compute
    np.testing.assert_allclose(loaded.predict(sets[:20]), model.predict(sets[:20]), rtol=1e-5)
    assert loaded.working_set_["without_shards"]


def test_shard_correction_gives_each_table_its_own_error_and_survives_a_checkpoint(ensemble, data, tmp_path):
    """Tables timed alone teach each table's own error: a set of one table then predicts what
    it measured, a table's column strip takes its table's correction, the set-size fit on top
    decides how much of it a fused set carries, and a checkpoint keeps all of it."""
    sets, _ = data
    model = copy.deepcopy(ensemble)
    sim = Simulator(TABLES, 1, load_cost_models())
    wholes = whole_pieces(TABLES)
    singles = np.concatenate([sim.features_of(sim.piece_ids([p])) for p in wholes])
    truth = np.where(np.arange(len(wholes)) % 2 == 0, 3.0, 0.5)  # half the tables 3x slower, half 2x faster
    measured = model.predict([row[None] for row in singles]) * truth
    model.fit_shard_correction(singles, measured, knee_bytes=1 << 20, row_cap=1_000_000)
    model.fit_set_size_correction([row[None] for row in singles], measured)
    np.testing.assert_allclose(model.predict([row[None] for row in singles]), measured, rtol=0.05)
    strips = [wholes[i].halve_cols()[0] for i in range(len(wholes)) if wholes[i].can_halve_cols()]
    strip_sets = [sim.features_of(sim.piece_ids([p])) for p in strips]
    ratio = model.predict(strip_sets) / ensemble.predict(strip_sets)
    slow = np.array([truth[p.table] > 1 for p in strips])
    assert slow.any() and (~slow).any() and ratio[slow].min() > ratio[~slow].max()
    bundle = CostModels(model, load_cost_models().comm, 4096, name="with-shard-correction")
    loaded = CostModels.load(bundle.save(tmp_path / "s.pt")).compute
    np.testing.assert_allclose(loaded.predict(sets[:20]), model.predict(sets[:20]), rtol=1e-5)
    model.fine_tune(sets[:40], measured[:1].repeat(40), sets[40:50], measured[:1].repeat(10), epochs=2)
    assert model.shard_refs_ is None and model.set_size_coef_ is None  # new members: corrections refitted


def test_work_model_is_a_second_opinion_a_search_can_use_and_a_checkpoint_keeps(ensemble, shipped_models, data,
                                                                                 tmp_path):
    """Costs linear in lookups x columns, shards and weight bytes are learnt by the work model
    (non-negative coefficients); the ensemble's estimate is unchanged, a checkpoint keeps it,
    and ``work_cost_models`` gives a search models of the work model alone."""
    sets, _ = data
    model = copy.deepcopy(ensemble)
    x = work_features(sets, row_cap=1_000)
    np.testing.assert_allclose(x[:, 1], [len(s) for s in sets])
    truth = 0.01 * x[:, 0] + 0.5 * x[:, 1] + 0.2
    model.fit_work_model(sets, truth, row_cap=1_000)
    work = model.work_model_
    assert isinstance(work, WorkComputeModel) and work.row_cap == 1_000
    assert work.coef_[0] == pytest.approx(0.01, rel=0.01) and work.coef_[1] == pytest.approx(0.5, rel=0.01)
    assert min(work.coef_) >= 0
    np.testing.assert_allclose(model.predict_work(sets), truth, rtol=1e-6)
    mean, spread = model.predict_with_spread(sets)  # the estimate and its spread stay the members'
    np.testing.assert_allclose(mean, ensemble.predict(sets), rtol=1e-6)
    np.testing.assert_allclose(spread, ensemble.spread(sets), rtol=1e-6)
    models = CostModels(model, shipped_models.comm, shipped_models.batch_size, name="with-work")
    loaded = CostModels.load(models.save(tmp_path / "w.pt")).compute
    np.testing.assert_allclose(loaded.predict_work(sets[:20]), truth[:20], rtol=1e-5)
    models_of_work = work_cost_models(models)
    assert models_of_work.compute is work and models_of_work.name == "with-work+work"
    plan = shard(TABLES, devices=3, memory="64MiB", cost_models=models_of_work)
    assert plan.num_devices == 3 and len(plan.shards) >= len(TABLES)
    assert work_cost_models(CostModels(ensemble, shipped_models.comm, 4096)) is None  # none fitted
    with pytest.raises(NeuroShardError, match="not fitted"):
        WorkComputeModel().predict(sets)
    with pytest.raises(NeuroShardError, match="at least 4 measured sets"):
        WorkComputeModel().fit(sets[:3], truth[:3])
    state = model.fitted_state()
    state["work_model"]["coef"] = [1.0]
    with pytest.raises(ValueError, match="work model needs 3 non-negative coefficients"):
        copy.deepcopy(ensemble).load_fitted_state(state)
