"""Plan export for TorchRec (checked against TorchRec's own types when importable) and
the `neuroshard search` / `neuroshard export` commands."""
from __future__ import annotations

import json

import pytest
from conftest import run_cli

from neuroshard.cli import main
from neuroshard.costmodels import analytic_cost_models
from neuroshard.errors import NeuroShardError
from neuroshard.plan import Plan, Shard
from neuroshard.search import ALGORITHMS, search_plan
from neuroshard.search.cli import ALGORITHM_CHOICES
from neuroshard.tables import Table, TableSet
from neuroshard.torchrec.export import TORCHREC_FORMAT, to_parameter_shardings, torchrec_sharding
from neuroshard.torchrec.guard import torchrec_available

needs_torchrec = pytest.mark.skipif(not torchrec_available(), reason="torchrec is not importable")


def _mixed_plan() -> Plan:
    """One table of each kind on 4 devices (2 hosts of 2): table-, column-, row-wise (all
    ranks, and one host's ranks) and a grid, rows in TorchRec's ceil blocks."""
    tables = [Table("tw", 100, 16, 1.0), Table("cw", 100, 32, 1.0), Table("rw", 99, 8, 1.0),
              Table("twrw", 91, 8, 1.0), Table("grid", 101, 16, 1.0)]
    shards = [Shard("tw", 0, 100, 0, 16, 3),
              Shard("cw", 0, 100, 0, 16, 1), Shard("cw", 0, 100, 16, 16, 2),
              *[Shard("rw", 25 * d, 25 if d < 3 else 24, 0, 8, d) for d in range(4)],
              Shard("twrw", 0, 46, 0, 8, 2), Shard("twrw", 46, 45, 0, 8, 3),
              Shard("grid", 0, 51, 0, 8, 0), Shard("grid", 51, 50, 0, 8, 1),
              Shard("grid", 0, 51, 8, 8, 2), Shard("grid", 51, 50, 8, 8, 3)]
    return Plan(tables, shards, 4, 10**6).validate()


def test_export_names_torchrec_sharding_types():
    exported = torchrec_sharding(_mixed_plan(), compute_device="cuda", local_world_size=2)
    assert exported["format"] == TORCHREC_FORMAT and exported["world_size"] == 4
    assert exported["local_world_size"] == 2
    kinds = {name: record["sharding_type"] for name, record in exported["tables"].items()}
    assert kinds == {"tw": "table_wise", "cw": "column_wise", "rw": "row_wise", "twrw": "table_row_wise",
                     "grid": "grid_shard"}
    cw = exported["tables"]["cw"]
    assert cw["ranks"] == [1, 2]
    assert cw["sharding_spec"][1] == {"shard_offsets": [0, 16], "shard_sizes": [100, 16], "placement": "rank:2/cuda:0"}
    assert exported["tables"]["grid"]["ranks"] == [0, 1, 2, 3]
    cpu = torchrec_sharding(_mixed_plan(), compute_device="cpu", local_world_size=2)
    assert cpu["tables"]["tw"]["sharding_spec"][0]["placement"] == "rank:3/cpu"
    with pytest.raises(NeuroShardError, match="local world size"):
        torchrec_sharding(_mixed_plan(), compute_device="cpu", local_world_size=3)


def _one_table(shards: list[Shard], rows: int = 1_000_001, dim: int = 16, devices: int = 2) -> Plan:
    return Plan([Table("big", rows, dim, 1.0)], shards, devices, 10**9).validate()


@pytest.mark.parametrize("shards, devices, reason", [
    # floor halves: TorchRec routes ids in ceil blocks, so these would return wrong rows
    ([Shard("big", 0, 500_000, 0, 16, 0), Shard("big", 500_000, 500_001, 0, 16, 1)], 2, "not TorchRec's blocks"),
    # ceil blocks on ranks out of order
    ([Shard("big", 0, 500_001, 0, 16, 1), Shard("big", 500_001, 500_000, 0, 16, 0)], 2, "cannot run in TorchRec"),
    # two row shards on 4 ranks of one host
    ([Shard("big", 0, 500_001, 0, 16, 2), Shard("big", 500_001, 500_000, 0, 16, 3)], 4, "row shards"),
    # nested halving: blocks 250001, 250000, 250000, 250000 are not ceil(1000001/4) blocks
    ([Shard("big", 250_001 * i - (i > 1) * (i - 1), n, 0, 16, i)
      for i, n in enumerate([250_001, 250_000, 250_000, 250_000])], 4, "not TorchRec's blocks"),
    # uneven grid: strips with different row cuts
    ([Shard("big", 0, 500_001, 0, 8, 0), Shard("big", 500_001, 500_000, 0, 8, 1),
      Shard("big", 0, 1_000_001, 8, 8, 1)], 2, "grid"),
])
def test_export_refuses_layouts_torchrec_would_run_wrong(shards, devices, reason):
    with pytest.raises(NeuroShardError, match=reason) as caught:
        torchrec_sharding(_one_table(shards, devices=devices), compute_device="cpu")
    assert "table 'big'" in str(caught.value) and "\n" not in str(caught.value)


def test_export_defaults_are_gpus_and_torchrecs_hosts():
    tables = [Table(f"t{i}", 10, 8, 1.0) for i in range(16)]
    plan = Plan(tables, [Shard(f"t{i}", 0, 10, 0, 8, i) for i in range(16)], 16, 10**6)
    exported = torchrec_sharding(Plan(tables[:4], plan.shards[:4], 4, 10**6))
    assert exported["compute_device"] == "cuda"  # an export is for GPU training, whatever machine writes it
    assert exported["local_world_size"] == 4  # TorchRec's rule: 8 per host, or all when not a multiple of 8
    exported = torchrec_sharding(plan, compute_device="cuda")
    assert exported["local_world_size"] == 8
    assert exported["tables"]["t12"]["sharding_spec"][0]["placement"] == "rank:12/cuda:4"
    placements = torchrec_sharding(plan, compute_device="cuda", local_world_size=4)["tables"]["t13"]["sharding_spec"]
    assert placements[0]["placement"] == "rank:13/cuda:1"


@pytest.mark.torchrec
@needs_torchrec
def test_export_builds_valid_torchrec_parameter_shardings():
    from torchrec.distributed.types import ParameterSharding
    plan = _mixed_plan()
    sizes = {t.name: (t.num_embeddings, t.embedding_dim) for t in plan.tables}
    shardings = to_parameter_shardings(json.loads(json.dumps(torchrec_sharding(plan, local_world_size=2))), sizes)
    assert set(shardings) == set(sizes)
    for name, sharding in shardings.items():
        assert isinstance(sharding, ParameterSharding)
        assert sum(m.shard_sizes[0] * m.shard_sizes[1] for m in sharding.sharding_spec.shards) == \
            sizes[name][0] * sizes[name][1]
    assert [m.placement.rank() for m in shardings["rw"].sharding_spec.shards] == [0, 1, 2, 3]
    # TorchRec's own checks refuse an overlap and a gap.
    broken = torchrec_sharding(plan, local_world_size=2)
    spec = broken["tables"]["cw"]["sharding_spec"]
    spec[1]["shard_offsets"] = [0, 8]
    with pytest.raises(ValueError):
        to_parameter_shardings(broken, sizes)
    spec[1]["shard_offsets"], spec[1]["shard_sizes"] = [0, 16], [100, 8]
    with pytest.raises(NeuroShardError):
        to_parameter_shardings(broken, sizes)


@pytest.mark.slow
def test_cli_search_writes_a_valid_plan_and_exports_it(tmp_path):
    assert ALGORITHM_CHOICES == ALGORITHMS  # the CLI lists every algorithm without importing the search
    tables = TableSet("cli", [Table(f"t{i}", 2_000 * (i + 1), [16, 32, 64][i % 3], 1.0 + i,
                                    {"zipf_alpha": 0.8}) for i in range(8)], 4096)
    tables_path = tables.write(tmp_path / "tables.json")
    model_path = analytic_cost_models().save(tmp_path / "analytic.pt")
    plan_path = tmp_path / "plan.json"
    done = run_cli("search", tables_path, "--devices", "4", "--memory", "4MiB", "--cost-model", model_path,
                   "--param", "depth=3", "--param", "grid_size=4", "-o", plan_path)
    assert done.returncode == 0, done.stderr
    plan = Plan.read(plan_path)
    assert plan.problems() == [] and plan.device_memory_bytes == 4 * 2**20
    assert set(plan.estimate) >= {"max_device_cost_ms", "per_device_cost_ms", "per_device_compute_ms",
                                  "per_device_fwd_comm_ms", "per_device_bwd_comm_ms"}
    assert set(plan.provenance) >= {"algorithm", "parameters", "cost_model", "created", "search_time_s"}
    assert plan.provenance["parameters"]["depth"] == 3
    assert "estimated max device cost" in done.stdout and "balanced bound" in done.stdout

    out = tmp_path / "torchrec.json"
    done = run_cli("export", plan_path, "--format", "torchrec", "-o", out)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(out.read_text())["tables"]) == {t.name for t in tables}

    done = run_cli("search", tables_path, "--devices", "2", "--memory", "1MiB", "--cost-model", model_path,
                   "-a", "size", "-o", tmp_path / "never.json")
    assert done.returncode == 2 and done.stderr.startswith("neuroshard: error:") and "too much" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "never.json").exists()


def test_searched_plans_export_for_torchrec():
    """Plans our searches write (row splits forced by memory included) are layouts
    TorchRec runs: the exporter refuses none of them."""
    import numpy as np
    models = analytic_cost_models()
    rng = np.random.default_rng(7)
    kinds: set[str] = set()
    for task in range(8):
        devices = [2, 4][task % 2]
        tables = TableSet(f"task{task}", [Table(f"t{i}", int(rng.integers(50, 20000)),
                                                int(rng.choice([4, 12, 16, 20, 32])), float(rng.uniform(0.5, 30)),
                                                {"zipf_alpha": float(rng.uniform(0.5, 1.3))})
                                          for i in range(int(rng.integers(3, 10)))], 512)
        memory = int(tables.total_bytes(4) / devices * rng.uniform(1.05, 2.0))
        for algorithm in ("neuroshard", "bayes", "size"):
            plan = search_plan(tables, devices=devices, memory=memory, algorithm=algorithm, cost_models=models,
                               seed=task,
                               **({"n_trials": 16} if algorithm == "bayes" else {}))
            exported = torchrec_sharding(plan, compute_device="cpu")
            kinds |= {r["sharding_type"] for r in exported["tables"].values()}
    assert {"table_wise", "column_wise", "row_wise"} <= kinds


@pytest.mark.torchrec
@needs_torchrec
def test_a_caching_kernel_exports_cache_params_torchrec_builds(tmp_path, capsys):
    """``--compute-kernel fused_uvm_caching`` (tables in host memory behind a device cache):
    every record carries ``cache_params``, and TorchRec's own ``CacheParams`` come out."""
    from torchrec.distributed.types import CacheAlgorithm, CacheParams
    plan = _mixed_plan()
    doc = json.loads(json.dumps(torchrec_sharding(plan, local_world_size=2, compute_kernel="fused_uvm_caching",
                                                  cache_load_factor=0.05, cache_algorithm="lfu")))
    assert all(r["cache_params"] == {"load_factor": 0.05, "algorithm": "LFU"} for r in doc["tables"].values())
    shardings = to_parameter_shardings(doc, {t.name: (t.num_embeddings, t.embedding_dim) for t in plan.tables})
    for sharding in shardings.values():
        assert sharding.compute_kernel == "fused_uvm_caching" and isinstance(sharding.cache_params, CacheParams)
        assert sharding.cache_params.load_factor == 0.05 and sharding.cache_params.algorithm == CacheAlgorithm.LFU
    default = torchrec_sharding(plan, local_world_size=2, compute_kernel="fused_uvm_caching")
    assert default["tables"]["tw"]["cache_params"] == {"load_factor": 0.2, "algorithm": "LRU"}  # TorchRec's default
    assert "cache_params" not in torchrec_sharding(plan, local_world_size=2)["tables"]["tw"]
    with pytest.raises(NeuroShardError, match="cache settings need compute kernel fused_uvm_caching"):
        torchrec_sharding(plan, local_world_size=2, cache_load_factor=0.1)
    with pytest.raises(NeuroShardError, match="load factor must be a number in"):
        torchrec_sharding(plan, local_world_size=2, compute_kernel="fused_uvm_caching", cache_load_factor=1.5)
    # the command line
    path = tmp_path / "plan.json"
    plan.write(path)
    out = tmp_path / "t.json"
    assert main(["export", str(path), "--compute-device", "cpu", "--local-world-size", "2", "--compute-kernel",
                 "fused_uvm_caching", "--cache-load-factor", "0.1", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["tables"]["cw"]["cache_params"] == {"load_factor": 0.1, "algorithm": "LRU"}
    assert main(["export", str(path), "--cache-algorithm", "lfu", "-o", str(out)]) == 2
    assert "cache settings need compute kernel fused_uvm_caching, got fused" in capsys.readouterr().err
