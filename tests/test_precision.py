"""Issue 16 item 4: weights precision (fp16 weights trained and costed at fp16) and
reduced-precision communication (fp16/bf16 all-to-all), on real fbgemm kernels and
real gloo processes.

Tolerances. fp16 keeps 11 significant bits, bf16 8: rounding a value to them changes
it by at most u = 2**-11 (fp16) or 2**-8 (bf16) of its size, and a stored fp16 weight
is one of the values 2**-10 x its size apart (one ulp).

* fp16 weights against the unsharded fp16 model (one TBE holding every table whole):
  both run fbgemm's fp16 update; only the order in which row-wise partial sums are added
  differs (fp32, last bits), which can move a stored weight to the neighbouring fp16
  value once per step: at most STEPS ulps of the largest weight.
* fp16/bf16 communication against fp32: every pooled embedding and every gradient is
  rounded once per step (relative error <= u each); the SGD update carries the
  gradient's error into the weights, so a weight's error stays within a few u of how far
  training moved it. The bound asserted is 4 u x the largest move (margin for the
  nonlinear dense part over STEPS steps), and the losses within 4 u relatively.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace

import numpy as np
import pytest
import torch

import neuroshard
from neuroshard.costmodels import resolve_cost_models
from neuroshard.costmodels.analytic import comm_terms
from neuroshard.costmodels.base import CostModels
from neuroshard.costmodels.precision import compute_scaling, measured_ratios, model_precision
from neuroshard.errors import NeuroShardError
from neuroshard.execution.exchange import PooledExchange
from neuroshard.execution.kernels import FusedEmbedding, fbgemm_available
from neuroshard.execution.launch import launch
from neuroshard.measured.calibrate import calibrate
from neuroshard.measured.collect import collect_compute
from neuroshard.plan import Plan
from neuroshard.runtime.model import init_rows, train_reference
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.search.score import score_plan
from neuroshard.search.simulator import Simulator
from neuroshard.tables import TableSet
from neuroshard.torchrec.export import qcomms_config
from neuroshard.torchrec.import_plan import plan_from_torchrec

TBE = pytest.mark.skipif(not fbgemm_available(), reason="fbgemm-gpu-cpu is not installed")
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
STEPS, BATCH, LR = 3, 48, 5.0  # the tables and plans: conftest's runtime_tables and runtime_plan


def _train(plan: Plan, devices: int, kernel: str = "fbgemm_tbe"):
    return run(RunConfig(plan, list(plan.tables), devices, steps=STEPS, batch_size=BATCH, lr=LR, kernel=kernel,
                         collect_weights=True, timeout_s=90))


# ------------------------------------------------------------ fp16 weights
@TBE
@pytest.mark.gloo
def test_fp16_weights_train_like_the_unsharded_fp16_model(runtime_tables, runtime_plan):
    plan = replace(runtime_plan("mixed", 2), bytes_per_element=2)
    result = _train(plan, 2)
    ref16 = train_reference(runtime_tables, STEPS, BATCH, LR, weights_precision="fp16")
    ref32 = train_reference(runtime_tables, STEPS, BATCH, LR)
    np.testing.assert_allclose(result.losses, ref16.losses, rtol=1e-5, atol=0)
    moved_off_fp32 = 0.0
    for t in runtime_tables:
        got, want = result.weights[t.name], ref16.weights[t.name].numpy()
        assert np.array_equal(got, got.astype(np.float16).astype(np.float32)), t.name  # stored as fp16
        ulp = 2.0**-10 * np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=STEPS * ulp)
        moved_off_fp32 = max(moved_off_fp32, np.abs(got - ref32.weights[t.name].numpy()).max())
    assert moved_off_fp32 > 0  # fp16 training is not fp32 training (about one fp16 ulp apart here)


def test_fp16_weights_read_back_rounded_and_int8_is_refused():
    init = [torch.rand(20, 8, generator=torch.Generator().manual_seed(1))]
    for kernel in (["fbgemm_tbe"] if fbgemm_available() else []) + ["embedding_bag"]:
        fused = FusedEmbedding([(20, 8)], kernel, lr=0.1, init=init, weights_precision="fp16")
        assert torch.equal(fused.weights()[0], init[0].half().float())
        assert fused.weights()[0].dtype == torch.float32
    with pytest.raises(Exception, match="int8 cannot be trained"):
        FusedEmbedding([(20, 8)], weights_precision="int8")


# ---------------------------------------------------- reduced-precision comm
@TBE
@pytest.mark.gloo
@pytest.mark.parametrize("precision, devices", [("fp16", 2), ("bf16", 3)])
def test_reduced_precision_comm_trains_within_its_rounding(precision, devices, runtime_tables, runtime_plan):
    ref = train_reference(runtime_tables, STEPS, BATCH, LR)
    result = _train(replace(runtime_plan("mixed", devices), comm_precision=precision), devices)
    u = UNIT_ROUNDOFF[precision]
    np.testing.assert_allclose(result.losses, ref.losses, rtol=4 * u, atol=0)
    worst = 0.0
    for t in runtime_tables:
        want = ref.weights[t.name].numpy()
        moved = np.abs(want - init_rows(t, 0, 0, t.num_embeddings).numpy()).max()
        err = np.abs(result.weights[t.name] - want).max()
        assert err <= 4 * u * moved, (t.name, err, moved)
        worst = max(worst, err / moved)
    assert worst > 0  # the casts happened: not bit-identical to fp32


def _exchange_worker(wctx, widths, batch, precision):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://", rank=wctx.rank, world_size=wctx.world_size)
    try:
        ex = PooledExchange.for_widths(widths, wctx.rank, wctx.world_size, batch, torch.device("cpu"), precision)
        gen = torch.Generator().manual_seed(wctx.rank)
        pooled = torch.randn(batch, widths[wctx.rank], generator=gen)
        grad = torch.randn(ex.batch_sizes[wctx.rank], ex.output_width, generator=gen)
        return [x.numpy() for x in (pooled, ex.forward(pooled), grad, ex.backward(grad))]  # by value
    finally:
        dist.destroy_process_group()


@pytest.mark.gloo
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_exchange_sends_exactly_the_cast_values(precision):
    """fp32: every received value is the sent one, bit for bit; fp16/bf16: it is the sent
    value rounded to that type, bit for bit (the cast is the only change)."""
    widths, batch = [3, 5, 4], 10
    out = launch(_exchange_worker, (widths, batch, precision), 3, 60)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    rounded = lambda x: torch.from_numpy(x).to(dtype).float().numpy()  # noqa: E731
    pooled = np.concatenate([out[r][0] for r in range(3)], axis=1)     # (B, all columns), rank order
    features = np.concatenate([out[r][1] for r in range(3)], axis=0)   # what each rank received, its samples
    assert np.array_equal(features, rounded(pooled))
    grads = np.concatenate([out[r][2] for r in range(3)], axis=0)      # (B, all columns)
    starts = np.cumsum([0, *widths])
    for r in range(3):
        assert np.array_equal(out[r][3], rounded(grads[:, starts[r]:starts[r + 1]]))
    assert np.array_equal(features, pooled) == (precision == "fp32")


# --------------------------------------------------------------- the model
@pytest.fixture
def tables(runtime_tables) -> TableSet:
    return TableSet("small", list(runtime_tables), 4096)


def test_modeled_comm_bytes_are_halved(tables, runtime_plan):
    models = resolve_cost_models(None)
    plan = runtime_plan("mixed", 2)
    sim32 = Simulator(tables, 2, models)
    sim16 = Simulator(tables, 2, models, comm_precision="fp16")
    est32, est16 = sim32.evaluate_plan(plan), sim16.evaluate_plan(plan)
    widths = np.array([[sum(s.num_cols for s in plan.shards_on(d)) for d in range(2)]], dtype=np.float64)
    # the measured (fp32) comm model is asked for the exchange that moves half the bytes
    bwd_half = sim32.comm.predict_backward(widths / 2) * sim32.scale
    np.testing.assert_allclose(est16.bwd_comm_ms, bwd_half, rtol=1e-12)
    assert (est16.bwd_comm_ms < est32.bwd_comm_ms).all() and (est16.fwd_comm_ms < est32.fwd_comm_ms).all()
    np.testing.assert_array_equal(est16.compute_ms, est32.compute_ms)
    terms32, terms16 = comm_terms(widths, 4096), comm_terms(widths / 2, 4096)
    np.testing.assert_allclose(terms16[..., 2:], terms32[..., 2:] / 2)  # send, receive, peak bytes


def test_fp16_weights_are_costed_with_the_measured_ratio(tables, runtime_plan):
    models = resolve_cost_models(None)
    ratio = measured_ratios()["fp16"]["compute_ratio_to_fp32"]
    assert 0.5 < ratio < 2.0 and "precision_ratio.py" in measured_ratios()["fp16"]["command"]
    plan32 = runtime_plan("mixed", 2)
    scored32 = score_plan(plan32, tables, models)
    scored16 = score_plan(replace(plan32, bytes_per_element=2), tables, models)
    np.testing.assert_allclose(scored16.estimate["per_device_compute_ms"],
                               np.array(scored32.estimate["per_device_compute_ms"]) * ratio, rtol=1e-5)
    np.testing.assert_allclose(scored16.estimate["per_device_bwd_comm_ms"], scored32.estimate["per_device_bwd_comm_ms"])
    # a model calibrated at fp16 needs no ratio for fp16 weights, and is carried back for fp32
    at16 = CostModels(models.compute, models.comm, models.batch_size, hardware={"weights_precision": "fp16"})
    assert compute_scaling(at16, "fp16") == (1.0, "fp16", {})
    factor, precision, record = compute_scaling(at16, "fp32")
    assert precision == "fp32" and factor == pytest.approx(1 / ratio) and record["cost_precision_scaling"]["from"] == "fp16"
    assert compute_scaling(models, "int8")[:2] == (1.0, "fp32")  # no ratio: stays at the model's fp32


def test_shard_records_precisions_and_fp32_plans_are_unchanged(tables, caplog):
    base = neuroshard_shard(tables)
    assert "comm_precision" not in base.to_dict() and "cost_precision" not in base.provenance
    half = neuroshard_shard(tables, bytes_per_element=2, comm_precision="fp16")
    assert half.comm_precision == "fp16" and half.to_dict()["comm_precision"] == "fp16"
    assert half.provenance["cost_precision"] == "fp16"
    assert half.provenance["cost_precision_scaling"]["from"] == "fp32"
    assert "precision_ratio.py" in half.provenance["cost_precision_scaling"]["measured_by"]
    assert "communication precision: fp16" in half.format_summary()
    with caplog.at_level(logging.WARNING):
        int8 = neuroshard_shard(tables, bytes_per_element=1)
    assert int8.provenance["cost_precision"] == "fp32" and "no measured ratio" in caplog.text


def neuroshard_shard(tables, **kw) -> Plan:
    return neuroshard.shard(tables, devices=2, memory="1GiB", algorithm="size", **kw)


def test_comm_precision_round_trips_through_the_plan_file(tmp_path, runtime_plan):
    plan = runtime_plan("mixed", 2)
    assert "comm_precision" not in plan.to_dict()
    for precision in ("fp16", "bf16"):
        path = replace(plan, comm_precision=precision).write(tmp_path / f"{precision}.json")
        assert json.loads(path.read_text())["comm_precision"] == precision
        again = Plan.read(path)
        assert again.comm_precision == precision and again.to_dict() == replace(plan, comm_precision=precision).to_dict()
    assert Plan.read(plan.write(tmp_path / "fp32.json")).comm_precision == "fp32"


# ------------------------------------------------------------------ TorchRec
@pytest.mark.gloo
@pytest.mark.torchrec
def test_exported_qcomms_run_in_torchrec_within_fp16_rounding(torchrec_interop):
    """The export's ``qcomms`` applied as TorchRec's QCommsConfig (DistributedModelParallel on
    2 gloo processes): the pooled outputs are those of the unsharded model rounded once to
    fp16 in the all-to-all. Pooled values are sums of at most 3 rows of TorchRec's initial
    weights (|w| <= 1/sqrt(rows) <= 1/sqrt(33) < 0.18), so they differ by at most
    3 x 0.18 x 2**-11 (one rounding); a difference above 0 shows the codec ran."""
    interop = torchrec_interop
    cases = {}
    for kind in ("table_wise", "column_wise", "row_wise"):
        doc = interop.export(replace(interop.plan(kind), comm_precision="fp16"))
        assert doc["qcomms"] == {"forward_precision": "fp16", "backward_precision": "fp16"}
        assert qcomms_config(doc).forward_precision.value == "fp16"
        assert plan_from_torchrec(doc, TableSet("t", interop.tables)).comm_precision == "fp16"
        cases[kind] = (interop.spec(interop.tables), doc)
    fp32 = interop.export(interop.plan("row_wise"))
    assert "qcomms" not in fp32 and qcomms_config(fp32) is None
    bound = 3 * 0.18 * 2.0**-11
    for r, results in enumerate(interop.run(list(cases.values()))):
        for name, res in zip(cases, results):
            assert 0 < res["forward"] <= bound, (name, r, res)


# ------------------------------------------------------------- measurement
@TBE
@pytest.mark.timing
def test_collect_compute_at_fp16_records_it_and_keeps_fp32_folders_apart(tmp_path, runtime_tables):
    tables = tmp_path / "t.json"
    TableSet("small", list(runtime_tables), 512).write(tables)
    options = dict(batch_size=512, max_tables=3, progress=False, repeats=1, max_repeats=1, warmup=0)
    assert collect_compute(tables, 2, tmp_path / "fp16", weights_precision="fp16", **options) == 2
    assert json.loads((tmp_path / "fp16" / "meta.json").read_text())["config"]["weights_precision"] == "fp16"
    assert collect_compute(tables, 1, tmp_path / "fp32", **options) == 1
    assert "weights_precision" not in json.loads((tmp_path / "fp32" / "meta.json").read_text())["config"]
    with pytest.raises(NeuroShardError, match="weights_precision"):  # one folder, one precision
        collect_compute(tables, 3, tmp_path / "fp16", **options)


@TBE
@pytest.mark.timing
def test_calibrate_at_fp16_fine_tunes_an_fp16_model(tables):
    models = resolve_cost_models(None)
    calibrated, report = calibrate(tables, models, devices=2, sets=8, epochs=20, weights_precision="fp16")
    # fine-tuned on fp16 timings it predicts fp16 (no ratio); a kept pre-trained model stays fp32 (ratio applies)
    assert model_precision(calibrated) == ("fp32" if report.kept_pretrained else "fp16")
    factor, precision, record = compute_scaling(calibrated, "fp16")
    assert precision == "fp16" and (factor == 1.0) == (not report.kept_pretrained) and bool(record) == report.kept_pretrained
