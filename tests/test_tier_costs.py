"""Measured tier costs (issue 29): the runtime's miss path timed on this machine (a host-memory
and a memory-mapped-file backing store), fitted per store with a line, used by ``TierCostModel``
and the search when asked (``tier_costs``, ``search --tier-costs measured``), and checked
against what the runtime then times on a small cached plan (real gloo processes)."""
from __future__ import annotations

import dataclasses
import json
import tempfile

import numpy as np
import pytest
from conftest import _runtime_plan, _runtime_tables, tiered_tables

from neuroshard.cli import main
from neuroshard.costmodels.samples.tiers import TIER_SIZES, MissPathLine, TierMeasurement, fit_line, measure_tier_costs
from neuroshard.costmodels.tiers import TIER_COST_SOURCE, TierCostModel
from neuroshard.errors import NeuroShardError
from neuroshard.optimizers import row_bytes
from neuroshard.plan import Plan
from neuroshard.search.api import search_plan
from neuroshard.tiers import IN_DEVICE_MEMORY, Tier
from neuroshard.topology import Topology, make_topology

#: a record as a slow CPU might measure it (no timing: the model and the search are pure)
RECORD = TierMeasurement("test CPU", MissPathLine(0.05, 2.0), MissPathLine(0.08, 0.5))


# ------------------------------------------------------------------- the fit
def test_the_fit_recovers_a_line_and_keeps_the_overhead_non_negative():
    x = np.array([1e4, 1e5, 1e6, 1e7])
    line = fit_line(x, 0.02 + x / 3e6)  # 3 GB/s, 20 us a round
    assert line.gbps == pytest.approx(3.0) and line.overhead_ms == pytest.approx(0.02)
    through_zero = fit_line(x, x / 2e6 - 1e-4)  # a negative intercept is noise: a line through 0
    assert through_zero.overhead_ms == 0 and through_zero.gbps == pytest.approx(2.0, rel=0.05)
    with pytest.raises(NeuroShardError, match="two sizes"):
        fit_line([1e4], [1.0])
    again = TierMeasurement.from_dict(json.loads(json.dumps(RECORD.to_dict())))
    assert again == RECORD and again.source == RECORD.source


@pytest.mark.timing
def test_the_miss_path_is_measured_on_both_stores(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    record = measure_tier_costs()
    print(f"\n{record.source}")
    for memory in ("host", "ssd"):
        line = record.line(memory)
        assert line.gbps > 0 and line.overhead_ms >= 0
        assert len(record.points[memory]) == len(TIER_SIZES)
        assert all(ms > 0 and moved > 0 for _, _, moved, ms in record.points[memory])
    assert record.source.startswith("measured on ") and "GB/s" in record.source
    assert not list(tmp_path.iterdir())  # the memory-mapped files and their folder are gone


# ------------------------------------------------------------------ the model
def test_a_measured_model_costs_misses_on_the_measured_lines():
    tables = tiered_tables(2, 100_000, batch=2048)
    t = tables[0]
    analytic = TierCostModel(None, 4, tables.batch_size, 4)
    measured = TierCostModel(None, 4, tables.batch_size, 4, measured=RECORD.to_dict())
    assert analytic.source == TIER_COST_SOURCE and measured.source == RECORD.source
    assert measured.source.startswith("measured on test CPU (host memory 2.00 GB/s, memory-mapped file 0.50 GB/s")
    unique = measured.curve(t)[0]
    full_row = row_bytes(t.embedding_dim, 4)
    for tier, line in ((Tier("host", 0.1), RECORD.host), (Tier("ssd", 0.1), RECORD.memmap)):
        misses = measured.miss_rate(t, 0.1) * unique
        want = line.overhead_ms + 2 * misses * full_row / (line.gbps * 1e6)
        got = measured.shard_ms(t, tier, t.num_embeddings, t.embedding_dim)
        assert got == pytest.approx(want)
        assert got != pytest.approx(analytic.shard_ms(t, tier, t.num_embeddings, t.embedding_dim))
    # no cache: every row the batch looks up is loaded and written back (the runtime's fused_uvm)
    no_cache = measured.shard_ms(t, Tier("host"), t.num_embeddings, t.embedding_dim)
    assert no_cache == pytest.approx(RECORD.host.ms(2 * unique * full_row))
    assert measured.shard_ms(t, IN_DEVICE_MEMORY, t.num_embeddings, t.embedding_dim) == 0.0


def test_a_search_costs_its_tiers_with_the_measured_record(analytic_models):
    tables = tiered_tables(8, 100_000, batch=2048)
    memory = tables.total_bytes() // 12
    topo = make_topology(4, host_memory_bytes=tables.total_bytes(), ssd_bytes=4 * tables.total_bytes())
    plans = {costs: search_plan(tables, 4, memory, "size-lookup", cost_models=analytic_models, topology=topo,
                                tier_costs=costs) for costs in ("analytic", RECORD)}
    analytic, measured = plans["analytic"].provenance["tiers"], plans[RECORD].provenance["tiers"]
    assert analytic["model"] == TIER_COST_SOURCE
    assert measured["model"] == RECORD.source and measured["model"].startswith("measured on test CPU")
    assert measured["tier_cost_ms"] != pytest.approx(analytic["tier_cost_ms"])
    assert plans[RECORD].estimate["max_device_cost_ms"] != pytest.approx(plans["analytic"].estimate["max_device_cost_ms"])
    # the search times nothing: "measured" belongs to its caller
    with pytest.raises(NeuroShardError, match="does not do"):
        search_plan(tables, 4, memory, "size-lookup", cost_models=analytic_models, topology=topo, tier_costs="measured")
    with pytest.raises(NeuroShardError, match="'analytic' or 'measured'"):
        search_plan(tables, 4, memory, "size-lookup", cost_models=analytic_models, topology=topo, tier_costs="fast")


@pytest.mark.timing
def test_search_tier_costs_measured_measures_and_says_so(tmp_path, capsys):
    tables = tiered_tables(6, 100_000, batch=2048)
    tables.write(tmp_path / "t.json")
    out = tmp_path / "p.json"
    code = main(["search", str(tmp_path / "t.json"), "-d", "2", "-m", str(tables.total_bytes() // 8), "-a",
                 "size-lookup", "--host-memory", str(2 * tables.total_bytes()), "--tier-costs", "measured",
                 "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    model = Plan.read(out).provenance["tiers"]["model"]
    assert model.startswith("measured on ") and "memory-mapped file" in model


# -------------------------------------------------------- against the runtime
TIERS = {"t0": Tier("host", 0.05), "t1": Tier("host"), "t2": Tier("ssd", 0.1), "t3": Tier("host", 0.5)}
STEPS, BATCH = 24, 48


@pytest.mark.gloo
@pytest.mark.timing
def test_the_runtime_miss_path_is_what_the_measured_model_predicts():
    """The small mixed plan of tests/test_runtime_cache.py (caches of 5-50%, no cache, SSD)
    trained on 2 gloo processes: the miss path it times per step, summed over the cached
    tables, within a factor of 3 of ``TierCostModel`` with this machine's measured lines."""
    from neuroshard.runtime.trainer import RunConfig, run
    tables = _runtime_tables()
    topo = Topology(2, host_memory_bytes=10**9, ssd_bytes=10**9)
    plan = _runtime_plan("mixed", 2)
    plan = dataclasses.replace(plan, topology=topo, shards=[dataclasses.replace(s, tier=TIERS.get(s.table, s.tier))
                                                            for s in plan.shards]).validate()
    record = measure_tier_costs()
    result = run(RunConfig(plan, tables, 2, steps=STEPS, batch_size=BATCH, lr=0.1, timeout_s=120))
    model = TierCostModel(topo, 2, BATCH, 4, measured=record)
    by_name = {t.name: t for t in tables}
    runtime_ms = {name: c["miss_path_ms_per_step"] for name, c in result.cache.items()}
    model_ms = {name: sum(model.shard_ms(by_name[name], s.tier, s.num_rows, s.num_cols)
                          for s in plan.shards_of(name)) for name in runtime_ms}
    ratio = sum(runtime_ms.values()) / sum(model_ms.values())
    print(f"\n{record.source}\nruntime / model miss path per step: {ratio:.2f} ("
          + ", ".join(f"{n} {runtime_ms[n]:.3f}/{model_ms[n]:.3f} ms" for n in sorted(runtime_ms)) + ")")
    assert set(runtime_ms) == set(TIERS)
    assert 1 / 3 <= ratio <= 3
