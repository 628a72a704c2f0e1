"""The iteration-time model (issue 31, items 2-4): the dense part's operators, the operator
cost models fitted on real timings of this machine, the critical path, and `neuroshard
estimate`."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli

from neuroshard.constants import ITERATION_TIE_MARGIN
from neuroshard.costmodels import dense
from neuroshard.costmodels.dense import OperatorModels, load_operator_models
from neuroshard.costmodels.metrics import gmae, ratio_error
from neuroshard.costmodels.samples.dense import collect_dense
from neuroshard.errors import FormatError
from neuroshard.execution.dense import build_dense
from neuroshard.model_spec import DEFAULT_MODEL, ModelSpec, dense_operators, dense_parameters
from neuroshard.search.iteration import STEP_CHAIN, critical_path, estimate_iteration
from neuroshard.tables import TableSet

SPECS = [DEFAULT_MODEL, ModelSpec(5, (32, 16), (24,), "cat", "small-cat"), ModelSpec(7, (), (8, 8), "dot", "flat")]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("dims", [[16, 8], [16, 16, 32, 4], [8]])
def test_the_operator_list_counts_what_the_module_holds(spec, dims):
    module = build_dense([type("T", (), {"embedding_dim": d})() for d in dims], 0, spec)
    params = list(module.parameters())
    assert dense_parameters(spec, dims) == (sum(p.numel() for p in params), len(params))
    ops = dense_operators(spec, dims, 100)
    linears = [m for m in module.modules() if m.__class__.__name__ == "Linear"]
    assert [op.features[1:3] for op in ops if op.kind == "linear"] == [(m.in_features, m.out_features) for m in linears]
    assert sum(op.kind == f"interaction_{spec.interaction}" for op in ops) == 1
    assert ops[-1].kind == "optimizer" and ops[-1].features[0] == sum(p.numel() for p in params)


def _law_samples(rng, n=240):
    """Samples following known laws, with 3% noise: what the fit must recover."""
    out = []
    for _ in range(n):
        b, i, o = (int(2 ** rng.uniform(5, 12)) for _ in range(3))
        fwd = 0.01 + 2e-8 * b * i * o
        out.append({"kind": "linear", "features": [b, i, o, 1], "fwd_ms": fwd * rng.normal(1, 0.03),
                    "bwd_ms": 2 * fwd * rng.normal(1, 0.03), "ms": 3 * fwd})
        size, ranks = float(2 ** rng.uniform(2, 24)), float(rng.choice([2, 3, 4]))
        out.append({"kind": "allreduce", "features": [size, ranks],
                    "ms": (0.1 + 0.05 * (ranks - 1) + 1e-6 * 2 * (ranks - 1) / ranks * size) * rng.normal(1, 0.03)})
    return out


def test_operator_models_recover_known_laws_and_extrapolate_by_work(tmp_path):
    rng = np.random.default_rng(0)
    models = OperatorModels().fit(_law_samples(rng))
    # GMAE as costmodels.metrics (and Lin et al.) define it: 3% noise leaves about 2%
    assert models.metrics_["linear.fwd_ms"]["held_out_gmae"] < 0.05
    assert models.metrics_["allreduce.ms"]["held_out_gmae"] < 0.05
    x = np.array([[512, 512, 512, 1], [256, 128, 64, 1]])
    assert gmae(models.predict("linear", x, "fwd_ms"), 0.01 + 2e-8 * x[:, :3].prod(axis=1)) < 0.1
    # beyond the measured shapes the time grows with the work (here 64x the largest measured)
    big = models.one("linear", [2**14, 2**14, 2**14, 1], "fwd_ms")
    assert big == pytest.approx(2e-8 * 2**42, rel=0.3)
    # the file keeps the samples and refits to the same predictions
    path = models.save(tmp_path / "ops.json")
    again = OperatorModels.read(path)
    assert np.allclose(again.predict("linear", x, "fwd_ms"), models.predict("linear", x, "fwd_ms"))
    with pytest.raises(Exception, match="no 'loss'"):
        models.one("loss", [64.0], "fwd_ms")


def test_one_gmae_for_operators_iterations_and_cost_models():
    """GMAE is the geometric mean of |relative error| everywhere (Lin et al.'s); the stricter
    exp(mean |log ratio|) - 1 that the iteration model's figures used before formats revision 17
    is ``ratio_error``, and the operator models report GMAE under ``held_out_gmae``."""
    predicted, measured = np.array([1.1, 0.5]), np.array([1.0, 1.0])
    assert gmae(predicted, measured) == pytest.approx(np.sqrt(0.1 * 0.5))
    assert ratio_error(predicted, measured) == pytest.approx(np.sqrt(1.1 * 2.0) - 1)
    assert ratio_error(predicted, measured) > gmae(predicted, measured)
    assert not hasattr(dense, "gmae") or dense.gmae is gmae  # no second definition under the same name


@pytest.mark.parametrize("data, message", [
    ({"format": "neuroshard.model/v1"}, "not an operator-costs file"),
    ({"format": "neuroshard.operator-costs/v1", "samples": []}, "'samples'"),
    ({"format": "neuroshard.operator-costs/v1", "samples": [{"kind": "gemm", "features": [1], "ms": 1}]},
     r"samples\[0\]: unknown kind 'gemm'"),
    ({"format": "neuroshard.operator-costs/v1", "samples": [{"kind": "barrier", "features": [2, 3], "ms": 1}]},
     r"samples\[0\]: field 'features'"),
    ({"format": "neuroshard.operator-costs/v1", "samples": [{"kind": "barrier", "features": [2], "ms": -1}]},
     r"samples\[0\]: field 'ms'"),
])
def test_a_bad_operator_costs_file_is_refused_in_one_line(tmp_path, data, message):
    path = tmp_path / "ops.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=message):
        OperatorModels.read(path)


def test_the_critical_path_waits_for_the_last_rank_at_each_collective():
    durations = [{t: 0.0 for t, _ in STEP_CHAIN if t != "allreduce_ms"} for _ in range(2)]
    durations[0].update(emb_fwd_ms=5.0, fwd_comm_ms=1.0, dense_fwd_ms=2.0, emb_bwd_ms=1.0, input_ms=1.0, sync_ms=0.5)
    durations[1].update(emb_fwd_ms=2.0, fwd_comm_ms=1.0, dense_fwd_ms=2.5, emb_bwd_ms=4.0, input_ms=1.0, sync_ms=0.5)
    terms, path, period = critical_path(durations)
    # rank 1 waits 3 ms for rank 0 in the forward exchange; rank 0 waits 3 ms for rank 1 at the barrier (+0.5 of its own)
    assert terms[1]["fwd_comm_ms"] == pytest.approx(4.0) and terms[0]["sync_ms"] == pytest.approx(3.5)
    assert period == pytest.approx(5 + 1 + 2.5 + 4 + 1 + 0.5)
    for row in terms:
        assert sum(row.values()) == pytest.approx(period)
    on_path = [(r, t) for r, t, ms in path if ms > 0]
    assert on_path == [(0, "emb_fwd_ms"), (0, "fwd_comm_ms"), (1, "dense_fwd_ms"), (1, "emb_bwd_ms"),
                       (1, "input_ms"), (1, "sync_ms")]


@pytest.mark.gloo
def test_collect_dense_measures_every_part_and_resumes(tmp_path):
    tiny = {"layers": {"count": 6, "rounds": 1, "min_ms": 0.1}, "optimizer": {"count": 10, "rounds": 1, "min_ms": 0.1},
            "input": {"count": 10, "rounds": 1, "batch_sizes": (64,)},
            "collectives": {"ranks": (2,), "rounds": 1, "sizes": [4, 4096, 2**20]},
            "embedding_split": {"count": 2, "batch_size": 256}}
    path = tmp_path / "ops.json"
    parts = []
    models = collect_dense(path, tiny, progress=parts.append)
    assert parts == ["layers", "optimizer", "input", "collectives", "embedding_split"]
    assert {"linear", "optimizer", "input", "allreduce", "barrier", "embedding_split"} <= models.kinds
    assert all(s["ms"] > 0 for s in models.samples_)
    assert 0.05 < models.one("embedding_split", [1], "fwd_share") < 0.95
    # an interrupted run keeps its parts: drop two, rerun, and only those are measured
    data = json.loads(path.read_text())
    data["samples"] = [s for s in data["samples"] if s["part"] not in ("input", "embedding_split")]
    path.write_text(json.dumps(data))
    parts.clear()
    collect_dense(path, tiny, progress=parts.append)
    assert parts == ["input", "embedding_split"]


def test_estimate_predicts_every_term_and_they_add_up_to_the_iteration(tmp_path, runtime_plan, runtime_tables,
                                                                     shipped_models):
    plan = runtime_plan("mixed", 2)
    tables = TableSet("rt", runtime_tables, batch_size=256)
    ops = load_operator_models()
    small = estimate_iteration(plan, tables, shipped_models, ops, DEFAULT_MODEL)
    big = estimate_iteration(plan, tables, shipped_models, ops, ModelSpec(13, (512, 256), (1024, 512, 256)))
    for est in (small, big):
        for row in est.per_rank:
            assert sum(row.values()) == pytest.approx(est.iteration_ms)
            assert all(v >= 0 for v in row.values())
        assert [t for _, t, _ in est.critical_path][:2] == ["emb_fwd_ms", "fwd_comm_ms"]
    assert big.per_rank[0]["dense_fwd_ms"] > 2 * small.per_rank[0]["dense_fwd_ms"]
    assert big.iteration_ms > small.iteration_ms
    # the command: a table, and the JSON the issue asks for
    tables.write(tmp_path / "t.json")
    plan.write(tmp_path / "p.json")
    (tmp_path / "m.json").write_text(json.dumps(SPECS[1].to_dict()))
    out = run_cli("estimate", tmp_path / "p.json", "--tables", tmp_path / "t.json", "--model", tmp_path / "m.json",
                  "-o", tmp_path / "e.json")
    assert out.returncode == 0, out.stderr
    assert "critical path:" in out.stdout and "not measured here" in out.stdout
    doc = json.loads((tmp_path / "e.json").read_text())
    assert doc["iteration_ms"] > 0 and len(doc["breakdown"]["per_rank"]) == 2
    assert doc["model"]["interaction"] == "cat" and doc["critical_path"]
    bad = run_cli("estimate", tmp_path / "p.json", "--tables", tmp_path / "t.json", "--model", tmp_path / "t.json")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "t.json" in bad.stderr


def test_estimate_warns_when_the_operator_costs_are_another_cpus(tmp_path, runtime_plan, runtime_tables):
    """One CPU name covers several generations: ``estimate`` compares the operator file's
    ``cpu_family`` and ``cpu_model_number`` too, and warns only when what it records differs."""
    from neuroshard.costmodels.samples.store import cpu_generation, cpu_model, hardware_info
    assert hardware_info("cpu").items() >= cpu_generation().items()  # what `collect dense` records
    TableSet("rt", runtime_tables, batch_size=256).write(tmp_path / "t.json")
    runtime_plan("mixed", 2).write(tmp_path / "p.json")
    ops = load_operator_models()
    outputs = {}
    for name, generation in (("here", cpu_generation()), ("older", {"cpu_family": "1", "cpu_model_number": "1"})):
        ops.hardware_ = {"cpu_model": cpu_model(), **generation}
        ops.save(tmp_path / f"{name}.json")
        out = run_cli("estimate", tmp_path / "p.json", "--tables", tmp_path / "t.json",
                      "--operator-costs", tmp_path / f"{name}.json")
        assert out.returncode == 0, out.stderr
        outputs[name] = out.stdout
    assert "warning: the operator costs were measured on" not in outputs["here"]
    if cpu_generation():  # a system that tells the generation (Linux)
        assert "warning: the operator costs were measured on" in outputs["older"]
        assert "family 1" in outputs["older"] and "collect dense" in outputs["older"]


def test_overheads_fit_each_term_and_stretch_the_period():
    points = [{"term": "dense_fwd_ms", "ranks": 2, "predicted_ms": p, "measured_ms": 0.5 + 1.5 * p} for p in (1, 2, 4, 8)]
    points += [{"term": "other_ms", "ranks": 2, "predicted_ms": 0.0, "measured_ms": m} for m in (0.2, 0.3, 0.25)]
    points += [{"term": "iteration_ms", "ranks": 3, "predicted_ms": p, "measured_ms": 1.2 * p} for p in (10, 20, 40)]
    ops = OperatorModels().fit(load_operator_models().samples_, {}, points)
    assert ops.overheads_["dense_fwd_ms"][2] == pytest.approx((0.5, 1.5), abs=1e-6)
    assert ops.overheads_["other_ms"][2] == (pytest.approx(0.25), 0.0)
    rows, where = ops.with_overheads([{"dense_fwd_ms": 2.0, "other_ms": 0.0, "emb_fwd_ms": 1.0}] * 3)
    # 3 ranks were not measured for these terms: the nearest count (2) is used, and said so
    assert rows[0] == {"dense_fwd_ms": pytest.approx(3.5), "other_ms": pytest.approx(0.25), "emb_fwd_ms": 1.0}
    assert "not measured" in where
    assert ops.with_period(10.0, 3) == pytest.approx(12.0) and ops.with_period(10.0, 2) == pytest.approx(12.0)
    assert OperatorModels().fit(ops.samples_).with_period(10.0, 2) == 10.0  # no points: the path itself


def test_the_stretch_of_ranks_sharing_the_machine_goes_to_the_dense_part_and_collectives(runtime_plan,
                                                                                       runtime_tables, shipped_models):
    """The period's stretch is spread over ``STRETCH_TERMS`` of each rank in proportion; the
    embeddings, data loading and the barrier keep their own figures."""
    from neuroshard.search.iteration import STRETCH_TERMS
    plan = runtime_plan("mixed", 2)
    tables = TableSet("rt", runtime_tables, batch_size=256)
    samples = load_operator_models().samples_
    plain = OperatorModels().fit(samples, {})
    points = [{"term": "iteration_ms", "ranks": 2, "predicted_ms": p, "measured_ms": 1.25 * p} for p in (10, 20, 40)]
    stretched = OperatorModels().fit(samples, {}, points)
    a = estimate_iteration(plan, tables, shipped_models, plain, DEFAULT_MODEL)
    b = estimate_iteration(plan, tables, shipped_models, stretched, DEFAULT_MODEL)
    assert b.iteration_ms == pytest.approx(1.25 * a.iteration_ms)
    for before, after in zip(a.per_rank, b.per_rank):
        for term in ("sync_ms", "input_ms", "emb_fwd_ms", "emb_bwd_ms"):  # they keep their own figures
            assert after[term] == pytest.approx(before[term])
        share = sum(before[t] for t in STRETCH_TERMS)
        for term in STRETCH_TERMS:
            assert after[term] - before[term] == pytest.approx(0.25 * a.iteration_ms * before[term] / share)
        assert sum(after.values()) == pytest.approx(b.iteration_ms)


@pytest.mark.gloo
def test_overheads_are_measured_in_real_runs_and_written_to_the_file(tmp_path, shipped_models):
    from neuroshard.runtime.overheads import calibrate_overheads
    ops = OperatorModels().fit(load_operator_models().samples_, {})
    config = ("broad", 4, 7, ModelSpec(8, (16,), (16,), "dot", "t"), 256, 2)
    fitted = calibrate_overheads(shipped_models, ops, [config], iterations=4, algorithms=("size", "dim", "lookup"))
    terms = {p["term"] for p in fitted.overhead_points_}
    assert {"input_ms", "emb_fwd_ms", "dense_fwd_ms", "dense_allreduce_ms", "sync_ms", "iteration_ms"} <= terms
    assert all(p["ranks"] == 2 and p["measured_ms"] >= 0 for p in fitted.overhead_points_)
    path = fitted.save(tmp_path / "ops.json")
    again = OperatorModels.read(path)
    assert again.overheads_ == fitted.overheads_ and "dense_fwd_ms" in again.overheads_


def test_search_by_the_iteration_objective_writes_the_fastest_predicted_step(tmp_path, runtime_tables):
    TableSet("rt", runtime_tables, batch_size=512).write(tmp_path / "t.json")
    (tmp_path / "m.json").write_text(json.dumps(SPECS[1].to_dict()))
    out = run_cli("search", tmp_path / "t.json", "-d", "2", "-m", "1GiB", "--objective", "iteration",
                  "--model", tmp_path / "m.json", "-o", tmp_path / "p.json")
    assert out.returncode == 0, out.stderr
    assert "objective iteration (small-cat" in out.stdout
    plan = json.loads((tmp_path / "p.json").read_text())
    objective = plan["provenance"]["objective"]
    predicted = objective["predicted_iteration_ms"]
    assert {"neuroshard", "size", "dim", "lookup", "size-lookup"} <= set(predicted) and "random" not in predicted
    assert objective["chosen"] == min(predicted, key=predicted.get) == plan["provenance"]["algorithm"]
    assert plan["estimate"]["iteration_ms"] == pytest.approx(predicted[objective["chosen"]])
    assert objective["model"]["interaction"] == "cat"
    # the candidates predicted within the tie margin of the chosen step are listed, and said
    fastest = predicted[objective["chosen"]]
    assert objective["tie_margin"] == ITERATION_TIE_MARGIN
    assert objective["ties"] == [n for n, ms in predicted.items()
                                 if n != objective["chosen"] and ms <= fastest * (1 + ITERATION_TIE_MARGIN) + 1e-6]
    assert ("a tie: " in out.stdout) == bool(objective["ties"])
    # a model file without the iteration objective would be ignored: refused, one line
    bad = run_cli("search", tmp_path / "t.json", "-d", "2", "-m", "1GiB", "--model", tmp_path / "m.json",
                  "-o", tmp_path / "q.json")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--objective iteration" in bad.stderr


def test_estimate_says_when_the_ranks_outnumber_the_cores_the_operator_costs_were_measured_on(
        tmp_path, runtime_plan, runtime_tables, shipped_models):
    """3 ranks on a 2-core machine share cores, which the critical path does not model: the
    estimate says so in ``sources`` and ``estimate`` prints it; 2 ranks there, or no core count, do not."""
    from neuroshard.search.iteration import shared_cores_note
    tables = TableSet("rt", runtime_tables, batch_size=256)
    ops = load_operator_models()
    ops.hardware_ = {**ops.hardware_, "cpu_count": 2}
    three = estimate_iteration(runtime_plan("mixed", 3), tables, shipped_models, ops, DEFAULT_MODEL)
    two = estimate_iteration(runtime_plan("mixed", 2), tables, shipped_models, ops, DEFAULT_MODEL)
    assert "3 ranks on the 2 cores" in three.sources["shared_cores"] and "shared_cores" not in two.sources
    assert shared_cores_note(3, {}) is None
    ops.save(tmp_path / "ops.json")
    tables.write(tmp_path / "t.json")
    runtime_plan("mixed", 3).write(tmp_path / "p.json")
    out = run_cli("estimate", tmp_path / "p.json", "--tables", tmp_path / "t.json", "--operator-costs", tmp_path / "ops.json",
                  "-o", tmp_path / "e.json")
    assert out.returncode == 0, out.stderr
    assert "warning: 3 ranks on the 2 cores" in out.stdout
    assert "share cores" in json.loads((tmp_path / "e.json").read_text())["sources"]["shared_cores"]
