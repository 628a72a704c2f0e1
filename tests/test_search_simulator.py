"""The simulator: per-device terms, waiting in forward communication, reductions, caching."""
from __future__ import annotations

import numpy as np
import pytest

from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet
from neuroshard.types import Piece, whole_pieces


def _tables(batch_size: int = 4096) -> TableSet:
    return TableSet("sim", [
        Table("heavy", 200_000, 64, 40.0, {"zipf_alpha": 0.6}),
        Table("light", 1_000, 64, 1.0),
        Table("mid", 50_000, 32, 8.0, {"zipf_alpha": 1.0}),
    ], batch_size)


def test_forward_comm_waits_for_the_slowest_device(analytic_models):
    tables = _tables()
    sim = Simulator(tables, 2, analytic_models)
    pieces = whole_pieces(tables)[:2]  # heavy and light: same width, very different compute
    est = sim.evaluate(pieces, np.array([[0, 1]]))
    assert est.compute_ms[0, 0] > est.compute_ms[0, 1]
    # Same widths, so without waiting both forward times would be equal; the light device waits.
    no_wait = sim.comm.predict_forward(np.array([[64.0, 64.0]]), np.zeros((1, 2))) * sim.scale
    assert est.fwd_comm_ms[0, 1] > est.fwd_comm_ms[0, 0]
    assert est.fwd_comm_ms[0, 0] == pytest.approx(no_wait[0, 0])
    assert est.fwd_comm_ms[0, 1] > no_wait[0, 1]
    # The plan's cost is its slowest device, and every device's total is the sum of its terms.
    total = est.compute_ms + est.fwd_comm_ms + est.bwd_comm_ms + est.reduce_ms
    assert np.allclose(est.total_ms, total)
    assert est.max_ms[0] == pytest.approx(total.max())
    record = est.to_dict()
    assert record["max_device_cost_ms"] == pytest.approx(max(record["per_device_cost_ms"]), rel=1e-6)
    assert {"per_device_compute_ms", "per_device_fwd_comm_ms", "per_device_bwd_comm_ms"} <= set(record)


def test_set_costs_are_cached_and_batched(analytic_models):
    tables = _tables()
    sim = Simulator(tables, 3, analytic_models)
    pieces = whole_pieces(tables)
    placements = np.array([[0, 1, 2], [1, 0, 2], [0, 0, 1], [2, 1, 0]])
    first = sim.evaluate(pieces, placements)
    calls, predicted = sim.model_calls, sim.sets_predicted
    assert calls == 1  # every device set of every candidate in one compute-model call
    again = sim.evaluate(pieces, placements)
    assert (sim.model_calls, sim.sets_predicted) == (calls, predicted)  # all from the cache
    assert np.array_equal(first.total_ms, again.total_ms)
    # The same set on another device, or in another order, is the same cached set.
    sim.evaluate(pieces, np.array([[2, 0, 1]]))
    assert sim.sets_predicted == predicted


def test_row_splits_are_charged_once_in_the_all_to_all(analytic_models):
    tables = _tables()
    sim = Simulator(tables, 2, analytic_models)
    heavy, light, mid = whole_pieces(tables)
    cols = [*heavy.halve_cols(), light, mid]
    rows = [*heavy.halve_rows(), light, mid]
    est_cols = sim.evaluate(cols, np.array([[0, 1, 0, 1]]))
    est_rows = sim.evaluate(rows, np.array([[0, 1, 0, 1]]))
    # Row shards send partial sums of all their columns: more all-to-all width, and the
    # receiver adds them up inside the exchange, so no second (reduce) term.
    assert est_rows.bwd_comm_ms.sum() > est_cols.bwd_comm_ms.sum()
    assert np.all(est_rows.reduce_ms == 0) and np.all(est_cols.reduce_ms == 0)
    same = sim.evaluate(rows, np.array([[0, 1, 0, 1]]))
    assert np.allclose(same.total_ms, est_rows.compute_ms + est_rows.fwd_comm_ms + est_rows.bwd_comm_ms)


def test_row_shard_features_follow_the_rows(analytic_models):
    tables = _tables()
    sim = Simulator(tables, 2, analytic_models)
    heavy = whole_pieces(tables)[0]
    top, bottom = heavy.halve_rows()
    ids = sim.piece_ids([heavy, top, bottom, Piece(0, 0, heavy.num_rows, 0, 32)])
    feats = sim.features_of(ids)
    pooling = feats[:, 2]
    assert pooling[1] + pooling[2] == pytest.approx(pooling[0], rel=0.05)
    assert feats[3, 0] == 32 and feats[3, 2] == pytest.approx(pooling[0])


def test_costs_scale_with_the_batch_size(analytic_models):
    small, large = _tables(4096), _tables(8192)
    placement = np.array([[0, 1, 1]])
    a = Simulator(small, 2, analytic_models).evaluate(whole_pieces(small), placement)
    b = Simulator(large, 2, analytic_models).evaluate(whole_pieces(large), placement)
    assert np.allclose(b.total_ms, 2 * a.total_ms)


def test_measured_comm_models_serve_only_near_their_device_counts(shipped_models):
    """Issue 30, item 3: the shipped comm models were measured on 2-4 processes; up to 4x
    that they cost the exchange, beyond it the exchange is bytes over the GPU-cluster
    defaults, hierarchical over hosts of 8, and the plan's provenance says which."""
    from neuroshard.search.api import search_plan
    from neuroshard.topology import Topology
    tables = TableSet("comm", [Table(f"t{i}", 1000 + 100 * i, 16, 2.0) for i in range(40)], batch_size=4096)
    assert shipped_models.comm_device_counts() == [2, 3, 4]
    near = Simulator(tables, 16, shipped_models)
    assert near.network is None and near.comm_source.startswith("measured: NeuralCommModel (2-4 devices)")
    far = Simulator(tables, 32, shipped_models)
    assert far.network is not None and far.network.local_world_size == 8 and far.host_size == 8
    assert far.comm_source.startswith("analytic: bytes over the GPU-cluster defaults")
    assert far.topology is None  # the plan records no hosts it was not given
    est = far.evaluate(whole_pieces(tables), np.arange(40)[None, :] % 32)
    assert est.inter_host_ms is not None and (est.inter_host_ms > 0).all()
    plan = search_plan(tables, 32, "1GiB", "size-lookup", cost_models=shipped_models)
    assert plan.provenance["comm_model"] == far.comm_source and plan.topology is None
    stated = search_plan(tables, 32, "1GiB", "size-lookup", cost_models=shipped_models,
                         topology=Topology(32, local_world_size=4))
    assert stated.provenance["comm_model"].startswith("analytic: bytes over the stated links (4 devices per host")


def test_pieces_of_equal_features_cost_exactly_the_same(shipped_models):
    """A table's two equal column halves are one set to the model: predicted once, in one
    canonical row order, so they tie exactly wherever and with whatever they are predicted
    (predicted apart, their last bits depended on the CPU, and so did which half the search
    split or placed first)."""
    tables = _tables()
    sim = Simulator(tables, 2, shipped_models)
    heavy, light, mid = whole_pieces(tables)
    left, right = Piece(0, 0, heavy.num_rows, 0, 32), Piece(0, 0, heavy.num_rows, 32, 32)
    ids = sim.piece_ids([left, right, light, mid])
    first = sim.set_costs_ms([(int(ids[0]),), (int(ids[2]), int(ids[3]))])
    predicted = sim.sets_predicted
    assert predicted == 2
    # the other half, alone and beside other pieces: nothing new for the model
    again = sim.set_costs_ms([(int(ids[1]),), (int(ids[2]), int(ids[3]))])
    assert sim.sets_predicted == predicted and again[0] == first[0]
    pairs = sim.set_costs_ms([tuple(sorted((int(ids[0]), int(ids[3])))), tuple(sorted((int(ids[1]), int(ids[3]))))])
    assert pairs[0] == pairs[1] and sim.sets_predicted == predicted + 1
    singles = sim.single_costs_ms([right, left, mid])
    assert singles[0] == singles[1] != singles[2]
