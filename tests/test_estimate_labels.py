"""What an estimate is for: planning GPU-looking devices with a CPU checkpoint warns once,
naming the checkpoint's hardware and the way out; ``evaluate`` compares the measured cost
with the plan's estimate at the same batch."""
from __future__ import annotations

import logging

import neuroshard.measured.api as measured_api
from neuroshard.measured.api import measured_search
from neuroshard.runtime.evaluate import Measurement
from neuroshard.tables import Table, TableSet

TABLES = TableSet("labels", [Table(f"t{i}", 1000 * (i + 1), 16, pooling_factor=2.0) for i in range(6)], batch_size=4096)


def test_gpu_sized_devices_with_the_cpu_checkpoint_warn_once(shipped_models, caplog, monkeypatch):
    monkeypatch.setattr(measured_api, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="neuroshard"):
        measured_search(TABLES, 2, "16GiB", cost_models=shipped_models)
        measured_search(TABLES, 2, "16GiB", cost_models=shipped_models)
    warnings = [r.getMessage() for r in caplog.records if "its estimates describe that CPU" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per process and cost model
    assert "devices of 16 GiB" in warnings[0] and shipped_models.describe_hardware() in warnings[0]
    assert "--calibrate" in warnings[0] and "Pre-training for your own hardware" in warnings[0]


def test_cpu_sized_devices_and_models_without_a_machine_do_not_warn(shipped_models, analytic_models, caplog,
                                                                   monkeypatch):
    monkeypatch.setattr(measured_api, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="neuroshard"):
        measured_search(TABLES, 2, "1GiB", cost_models=shipped_models)
        measured_search(TABLES, 2, "16GiB", cost_models=analytic_models)  # no machine recorded: nothing to compare
    assert "estimates describe" not in caplog.text


def test_evaluate_compares_the_estimate_at_its_own_batch(shipped_models):
    plan = measured_search(TABLES, 2, "1GiB", cost_models=shipped_models)
    est = plan.estimate["max_device_cost_ms"]
    m = Measurement(plan=plan, per_device=[{"device": 0, "shards": 3, "compute_ms": 1.0, "total_ms": 2.0,
                                            "step_ms": 2.5}], backend="cpu",
                    kernel="fused", clock="thread", batch_size=1024, iterations=3, warmup=1)
    text = m.format()
    assert f"estimated by the plan at batch 4,096 for {plan.provenance['cost_model_hardware']}" in text
    assert f"({est / 4:.3f} ms at batch 1,024, linearly)" in text
