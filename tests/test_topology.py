"""Issue 16 item 1: topology (hosts, links, per-device memory and speed) in the search,
the simulator, plans, the runtime and the TorchRec export."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import algorithm_params, run_cli

import neuroshard
from neuroshard.constants import DEFAULT_INTER_HOST_GBPS, DEFAULT_INTRA_HOST_GBPS
from neuroshard.costmodels import analytic_cost_models
from neuroshard.errors import NeuroShardError
from neuroshard.plan import Plan
from neuroshard.runtime.model import train_reference
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.search.score import score_plan
from neuroshard.search.simulator import Simulator
from neuroshard.tables import Table, TableSet
from neuroshard.topology import Topology, make_topology, resolve_topology, topology_from_options
from neuroshard.torchrec.export import torchrec_sharding
from neuroshard.torchrec.guard import torchrec_available
from neuroshard.types import Piece


def _task() -> TableSet:
    """Small tables; 'g' (width 12, not halvable) is larger than a device of 100 KiB."""
    return TableSet("topo", [Table("a", 101, 16, 8.0, {"zipf_alpha": 1.1}), Table("b", 57, 8, 1.0),
                             Table("c", 33, 16, 3.0), Table("g", 3001, 12, 20.0), Table("h", 1501, 32, 10.0)], 512)


# ----------------------------------------------------------------- the record
def test_topology_file_and_flags(tmp_path):
    path = tmp_path / "topo.json"
    path.write_text(json.dumps({"format": "neuroshard.topology/v1", "num_devices": 8, "local_world_size": 4,
                                "inter_host_gbps": 25, "device_memory_bytes": ["16GiB"] * 4 + ["8GiB"] * 4,
                                "relative_speed": [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5]}))
    topo = Topology.read(path, 8)
    assert (topo.local_world_size, topo.num_hosts) == (4, 2)
    assert (topo.intra_host_gbps, topo.inter_host_gbps) == (DEFAULT_INTRA_HOST_GBPS, 25.0)  # the default filled in
    assert topo.device_memory_bytes == (16 * 2**30,) * 4 + (8 * 2**30,) * 4
    assert topo.host_of().tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert Topology.from_dict(topo.to_dict(), 8) == topo  # what a plan records reads back the same
    # flags replace the file's fields
    flagged = topology_from_options(str(path), 8, 2, None, 50.0)
    assert (flagged.local_world_size, flagged.inter_host_gbps, flagged.device_memory_bytes) == \
        (2, 50.0, topo.device_memory_bytes)
    # a local world size alone states hosts with the GPU-cluster defaults
    only = topology_from_options(None, 8, 8, None, None)
    assert (only.num_hosts, only.intra_host_gbps, only.inter_host_gbps) == (1, 600.0, 12.5)
    assert DEFAULT_INTER_HOST_GBPS == 12.5
    assert topology_from_options(None, 8, None, None, None) is None
    # the same memory everywhere and speed 1 are no topology of their own
    assert resolve_topology({"relative_speed": [1.0] * 4}, 4, [100] * 4) == (None, 100)
    assert resolve_topology({"device_memory_bytes": "1KiB"}, 4, None) == (None, 1024)
    assert resolve_topology({"device_memory_bytes": [1024, 2048]}, 2, None)[1] == 2048


def test_a_plan_without_topology_is_written_as_before():
    tables = _task()
    models = analytic_cost_models()
    plain = neuroshard.shard(tables, devices=4, memory="100KiB", cost_models=models)
    flat = neuroshard.shard(tables, devices=4, memory="100KiB", cost_models=models, topology={})
    listed = neuroshard.shard(tables, devices=4, memory=["100KiB"] * 4, cost_models=models)
    for plan in (plain, flat, listed):
        data = plan.to_dict()
        assert "topology" not in data and "topology" not in data["provenance"]
        assert plan.topology is None
    assert plain.shards == flat.shards == listed.shards and plain.estimate == flat.estimate == listed.estimate
    # a simulator with a topology that states nothing estimates exactly as without one
    pieces, devices = Simulator(tables, 4, models).pieces_of_plan(plain)
    a = Simulator(tables, 4, models).evaluate(pieces, devices[None, :]).to_dict()
    b = Simulator(tables, 4, models, topology=Topology(4)).evaluate(pieces, devices[None, :]).to_dict()
    assert a == b and "per_device_intra_host_comm_ms" not in a


def test_a_topology_built_directly_takes_the_defaults_make_topology_gives():
    """Topology(8, local_world_size=4) used to leave the links None, and the search
    failed deep in the simulator; it now means what the file or the flags would."""
    for kwargs in ({"local_world_size": 4}, {"intra_host_gbps": 100.0}, {"inter_host_gbps": 25.0}):
        direct, checked = Topology(8, **kwargs), make_topology(8, **kwargs)
        assert direct == checked and direct.hosts_stated
    assert Topology(8) == make_topology(8) and not Topology(8).hosts_stated
    plan = neuroshard.shard(_task(), devices=4, memory="100KiB", cost_models=analytic_cost_models(),
                            topology=Topology(4, local_world_size=2))
    assert plan.topology.intra_host_gbps == DEFAULT_INTRA_HOST_GBPS
    assert plan.topology.inter_host_gbps == DEFAULT_INTER_HOST_GBPS


# ----------------------------------------------------- the estimate over hosts
def test_the_exchange_splits_into_intra_and_inter_host_parts_as_computed_by_hand():
    """4 devices, 2 hosts x 2, 100 GB/s within a host and 10 GB/s across; 'A' (8 columns) on
    device 0, 'B' (16) on device 2, 'C' (4 columns) in 2 row blocks on devices 2 and 3 (one
    host: table-row-wise, each block sends 2 columns and reduce-scatters half of C's sums)."""
    batch = 1000
    tables = TableSet("hand", [Table("A", 100, 8, 1.0), Table("B", 100, 16, 1.0), Table("C", 100, 4, 1.0)], batch)
    topo = make_topology(4, local_world_size=2, intra_host_gbps=100, inter_host_gbps=10)
    sim = Simulator(tables, 4, analytic_cost_models(), topology=topo)
    pieces = [Piece(0, 0, 100, 0, 8), Piece(1, 0, 100, 0, 16), Piece(2, 0, 50, 0, 4), Piece(2, 50, 50, 0, 4)]
    est = sim.evaluate(pieces, np.array([[0, 2, 2, 3]]))
    # widths sent: [8, 0, 16 + 2, 2]; bytes per column and peer: B/4 samples x 4 bytes = B
    # device: intra = max(sent x 1 peer, received from the host's other device); inter likewise with 2 peers
    intra_bytes = np.array([max(8, 0), max(0, 8), max(18, 2), max(2, 18)]) * batch
    inter_bytes = np.array([max(16, 20), max(0, 20), max(36, 8), max(4, 8)]) * batch
    intra_ms, inter_ms = intra_bytes / 100e6, inter_bytes / 10e6
    np.testing.assert_allclose(est.bwd_comm_ms[0], intra_ms + inter_ms, rtol=1e-12)
    np.testing.assert_allclose(est.intra_host_ms[0], 2 * intra_ms, rtol=1e-12)  # forward + backward
    np.testing.assert_allclose(est.inter_host_ms[0], 2 * inter_ms, rtol=1e-12)
    # C's blocks reduce-scatter (k-1)/k = 1/2 of B x 4 columns x 4 bytes over the intra-host links
    np.testing.assert_allclose(est.reduce_ms[0], np.array([0, 0, 0.5, 0.5]) * batch * 4 * 4 / 100e6, rtol=1e-12)
    ready = est.compute_ms[0] + est.bwd_comm_ms[0] + est.reduce_ms[0]
    np.testing.assert_allclose(est.fwd_comm_ms[0], intra_ms + inter_ms + ready.max() - ready, rtol=1e-12)
    # the same blocks on two hosts are row-wise: each sends C's 4 columns, nothing is reduced within a
    # host; widths [8, 4, 16, 4]
    across = sim.evaluate(pieces, np.array([[0, 2, 1, 3]]))
    assert (across.reduce_ms == 0).all()
    np.testing.assert_allclose(across.inter_host_ms[0], 2 * np.array([20, 20, 32, 12]) * batch / 10e6, rtol=1e-12)
    # half precision halves every byte
    half = Simulator(tables, 4, analytic_cost_models(), topology=topo, comm_precision="fp16")
    np.testing.assert_allclose(half.evaluate(pieces, np.array([[0, 2, 2, 3]])).bwd_comm_ms, est.bwd_comm_ms / 2)
    # relative speed divides compute
    slow = Simulator(tables, 4, analytic_cost_models(),
                     topology=make_topology(4, 2, 100, 10, relative_speed=[1, 1, 0.5, 0.25]))
    np.testing.assert_allclose(slow.evaluate(pieces, np.array([[0, 2, 2, 3]])).compute_ms[0],
                               est.compute_ms[0] / [1, 1, 0.5, 0.25])


# --------------------------------------------------------- per-device memory
@pytest.mark.parametrize("algorithm", algorithm_params())
def test_every_algorithm_respects_per_device_memory(algorithm):
    if algorithm == "torchrec" and not torchrec_available():
        pytest.skip("TorchRec is not importable")
    tables = TableSet("het", [Table(f"t{i}", 400 + 150 * i, 16, 1.0 + i % 3) for i in range(10)], 256)
    total = tables.total_bytes(4)
    small, big = int(total * 0.2), int(total * 0.8)  # the small device cannot take its quarter of the tables
    memory = [big, small, big, big]
    params = {"passes": 1, "repeats": 1} if algorithm == "measured-greedy" else {}
    plan = neuroshard.shard(tables, devices=4, memory=memory, algorithm=algorithm,
                            cost_models=analytic_cost_models(), **params)
    used = plan.memory_used_bytes()
    assert all(u <= m for u, m in zip(used, memory)), (used, memory)
    assert max(used) > small  # the large devices hold more than a small one could
    assert plan.device_memory_bytes == big and plan.topology.device_memory_bytes == tuple(memory)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.memory_limits() == memory and again.problems() == []
    # the same shards on devices with the small memory everywhere are invalid
    uniform = Plan(plan.tables, plan.shards, 4, small)
    assert any("device" in p for p in uniform.problems())


# ------------------------------------------------------------- table-row-wise
def _twrw_plan() -> Plan:
    """A searched plan for 2 hosts x 2 devices: 'g' does not fit one device and its row
    blocks stay on one host's ranks (table-row-wise)."""
    plan = neuroshard.shard(_task(), devices=4, memory="100KiB", cost_models=analytic_cost_models(),
                            topology={"local_world_size": 2, "inter_host_gbps": 1})
    return plan


def test_the_search_lays_out_row_blocks_on_one_host_and_exports_table_row_wise():
    plan = _twrw_plan()
    assert plan.topology.local_world_size == 2 and plan.provenance["topology"].startswith("2 hosts x 2")
    blocks = sorted(plan.shards_of("g"), key=lambda s: s.row_offset)
    assert len(blocks) == 2 and [s.device for s in blocks] in ([0, 1], [2, 3])
    doc = torchrec_sharding(plan, compute_device="cpu")  # the local world size comes from the plan
    assert doc["local_world_size"] == 2 and doc["tables"]["g"]["sharding_type"] == "table_row_wise"
    assert "per_device_inter_host_comm_ms" in plan.estimate
    # re-scoring the plan (its topology read back from the file) reproduces the estimate
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    rescored = score_plan(again, _task(), cost_models=analytic_cost_models())
    assert rescored.estimate["per_device_cost_ms"] == plan.estimate["per_device_cost_ms"]


def test_table_row_wise_beats_row_wise_across_hosts_in_the_estimate():
    """The search prefers the host-local layout: the same blocks spread over both hosts
    cost more inter-host traffic."""
    plan = _twrw_plan()
    sim = Simulator(_task(), 4, analytic_cost_models(), topology=plan.topology)
    pieces, devices = sim.pieces_of_plan(plan)
    g = [i for i, p in enumerate(pieces) if p.table == 3]
    spread = devices.copy()
    spread[g] = [0, 2] if devices[g[0]] != 0 else [1, 3]
    assert sim.evaluate(pieces, spread[None, :]).inter_host_ms.sum() > \
        sim.evaluate(pieces, devices[None, :]).inter_host_ms.sum()


@pytest.mark.gloo
def test_a_table_row_wise_plan_trains_like_the_unsharded_model():
    """The CPU runtime on 4 gloo processes (2 hosts x 2 ranks)."""
    plan = _twrw_plan()
    tables = list(plan.tables)
    reference = train_reference(tables, 3, 48, 5.0)
    result = run(RunConfig(plan, tables, 4, steps=3, batch_size=48, lr=5.0, collect_weights=True, timeout_s=120))
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    for t in tables:
        np.testing.assert_allclose(result.weights[t.name], reference.weights[t.name].numpy(), rtol=0, atol=1e-5)


# -------------------------------------------------------- TorchRec, 2 hosts x 2
@pytest.mark.gloo
@pytest.mark.torchrec
def test_the_table_row_wise_export_runs_exactly_in_torchrec(torchrec_interop):
    """The exported plan in DistributedModelParallel on 4 gloo processes, LOCAL_WORLD_SIZE=2:
    the same pooled outputs and SGD step as the unsharded model."""
    plan = _twrw_plan()
    doc = torchrec_interop.export(plan)  # the local world size comes from the plan's topology
    assert "table_row_wise" in {r["sharding_type"] for r in doc["tables"].values()}
    per_rank = torchrec_interop.run([(torchrec_interop.spec(plan.tables), doc)], world=4, local_world_size=2,
                                    timeout=240)
    for rank, [res] in enumerate(per_rank):
        assert res["forward"] < 1e-5 and res["weights"] < 1e-5 and res["after_step"] < 1e-5, (rank, res)


# ------------------------------------------------------------------- the CLI
@pytest.mark.slow
def test_search_with_a_topology_file_and_flags_then_show_and_export(tmp_path):
    tables = tmp_path / "tables.json"
    _task().write(tables)
    topo = tmp_path / "topo.json"
    topo.write_text(json.dumps({"format": "neuroshard.topology/v1", "local_world_size": 2,
                                "device_memory_bytes": ["100KiB", "100KiB", "80KiB", "80KiB"]}))
    plan_path, out = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    model = tmp_path / "analytic.pt"
    analytic_cost_models().save(model)
    done = run_cli("search", tables, "-d", "4", "--topology", topo, "--inter-host-gbps", "25",
                   "--cost-model", model, "-o", plan_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(plan_path.read_text())
    assert data["topology"] == {"local_world_size": 2, "intra_host_gbps": 600.0, "inter_host_gbps": 25.0,
                                "device_memory_bytes": [102400, 102400, 81920, 81920]}
    assert data["device_memory_bytes"] == 102400
    shown = run_cli("plan", "show", plan_path)
    assert shown.returncode == 0 and "topology: 2 hosts x 2 devices" in shown.stdout, shown.stderr
    # what the estimate is for, compute and communication apart, the bound in words
    assert "at batch 512 (all devices together)" in shown.stdout and "by cost model 'analytic-defaults'" in shown.stdout
    assert "compute_ms" in shown.stdout and "comm_ms" in shown.stdout
    assert "balanced bound:" in shown.stdout and "spread evenly over 4 devices" in shown.stdout
    done = run_cli("export", plan_path, "--compute-device", "cpu", "-o", out)
    assert done.returncode == 0 and json.loads(out.read_text())["local_world_size"] == 2, done.stderr
    # --memory as a comma list, no topology file
    done = run_cli("search", tables, "-d", "4", "-m", "100KiB,100KiB,80KiB,80KiB", "--cost-model", model,
                   "-o", plan_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(plan_path.read_text())["topology"] == {"device_memory_bytes": [102400, 102400, 81920, 81920]}


def test_bad_topology_arguments_to_shard_are_one_line():
    for kwargs, text in ((dict(topology=5), "topology"), (dict(topology={"local_world_size": 3}), "local_world_size"),
                         (dict(memory=["1GiB"] * 3), "memory"), (dict(memory=None), "memory"),
                         (dict(topology={"relative_speed": [1, -1, 1, 1]}), "relative_speed")):
        call = {"tables": _task(), "devices": 4, "memory": "1GiB", "cost_models": analytic_cost_models(), **kwargs}
        with pytest.raises(NeuroShardError) as info:
            neuroshard.shard(**call)
        assert text in str(info.value) and "\n" not in str(info.value)
