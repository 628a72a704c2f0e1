"""The runtime measures one training iteration term by term (``constants.ITERATION_TERMS``):
every step's terms add up to its period, ``evaluate`` reports the iteration time and each
rank's breakdown, and the JSON of ``evaluate -o`` carries them (real gloo processes)."""
from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from conftest import run_cli

from neuroshard.cli import main
from neuroshard.constants import ITERATION_TERMS
from neuroshard.runtime.evaluate import summarize
from neuroshard.runtime.model import train_reference
from neuroshard.runtime.trainer import AllreduceSpans, RunConfig, run
from neuroshard.tables import TableSet

STEPS, WARMUP, BATCH = 8, 2, 256
TERMS = [t for t in ITERATION_TERMS if t != "allreduce_ms"]  # the plans here replicate no table
JITTER_MS = 0.5  # other_ms is a difference of clock readings: allowed this far below zero


def test_allreduce_spans_count_overlapping_buckets_once_within_the_window():
    spans = AllreduceSpans([(1.0, 3.0), (2.0, 4.0), (6.0, 7.0), (6.5, 6.8)])
    assert spans.wall(0.0, 10.0) == pytest.approx(4.0)  # [1, 4] and [6, 7]
    assert spans.wall(2.5, 6.5) == pytest.approx(2.0)  # clipped to the window: [2.5, 4] and [6, 6.5]
    spans.reset()
    assert spans.wall(0.0, 10.0) == 0.0


@pytest.mark.gloo
@pytest.mark.timing
def test_each_step_splits_into_terms_that_add_up_to_its_period(runtime_tables, runtime_plan):
    plan = runtime_plan("mixed", 2)
    result = run(RunConfig(plan, runtime_tables, 2, steps=STEPS, batch_size=BATCH, timeout_s=60))
    # the loss is each rank's share summed after the run: still the unsharded model's
    np.testing.assert_allclose(result.losses, train_reference(runtime_tables, STEPS, BATCH, 0.1).losses,
                               rtol=0, atol=1e-5)
    for records in result.records:
        assert len(records) == STEPS
        for r in records:
            assert [t for t in ITERATION_TERMS if t in r] == TERMS
            assert all(r[t] >= 0 for t in TERMS if t != "other_ms") and r["other_ms"] > -JITTER_MS
            assert sum(r[t] for t in TERMS) == pytest.approx(r["period_ms"], rel=1e-9)
            assert r["dense_allreduce_ms"] > 0  # two ranks: the dense gradients are all-reduced
            # the existing figures keep their meaning
            assert r["compute_wall_ms"] == pytest.approx(r["emb_fwd_ms"] + r["emb_bwd_ms"], rel=1e-9)
            assert r["step_ms"] < r["period_ms"]

    m = summarize(plan, result, WARMUP, BATCH)
    per_step = [statistics.fmean(records[s]["period_ms"] for records in result.records) for s in range(WARMUP, STEPS)]
    assert m.iteration_ms == pytest.approx(statistics.median(per_step), rel=1e-12)
    assert len(m.breakdown) == 2
    for rank, row in enumerate(m.breakdown):
        assert list(row) == TERMS + ["period_ms"]
        assert sum(row[t] for t in TERMS) == pytest.approx(row["period_ms"], rel=1e-6)
        periods = [r["period_ms"] for r in result.records[rank][WARMUP:]]
        assert min(periods) <= row["period_ms"] <= max(periods)
        assert row["other_ms"] > -JITTER_MS and row["dense_allreduce_ms"] > 0
    text = m.format()
    assert f"iteration: {m.iteration_ms:.3f} ms per step (median after warm-up)" in text
    assert "dense_allreduce_ms" in text and "rank 1" in text


@pytest.mark.gloo
@pytest.mark.timing
def test_evaluate_writes_the_iteration_and_its_breakdown(tmp_path, runtime_tables, runtime_plan):
    runtime_plan("mixed", 2).write(tmp_path / "plan.json")
    TableSet("runtime", runtime_tables, BATCH).write(tmp_path / "tables.json")
    out = run_cli("evaluate", "plan.json", "--tables", "tables.json", "--iterations", "6", "--warmup", "2",
                  "-o", "m.json", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "iteration:" in out.stdout and "iterations/s" in out.stdout
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["iteration_ms"] > 0
    assert m["breakdown"]["terms"] == TERMS
    assert len(m["breakdown"]["per_rank"]) == 2
    for row in m["breakdown"]["per_rank"]:
        assert sum(row[t] for t in TERMS) == pytest.approx(row["period_ms"], rel=1e-6)


def test_an_unwritable_output_fails_before_the_run(tmp_path, capsys, runtime_tables, runtime_plan):
    runtime_plan("mixed", 2).write(tmp_path / "plan.json")
    TableSet("runtime", runtime_tables, BATCH).write(tmp_path / "tables.json")
    code = main(["evaluate", str(tmp_path / "plan.json"), "--tables", str(tmp_path / "tables.json"),
                 "-o", str(tmp_path / "plan.json" / "m.json")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write measurement file" in err and len(err.strip().splitlines()) == 1
