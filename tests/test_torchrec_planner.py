"""NeuroShardPlanner, the drop-in TorchRec ShardingPlanner: its collective plan runs in
DistributedModelParallel on 2 gloo processes exactly as the unsharded model (conftest's
``torchrec_interop``), TorchRec's constraints and sharders are honoured or refused in one
line naming the table, the tables are read from the model, and its plan is the one
``neuroshard.search.api.search_plan`` writes for the same task."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest

pytest.importorskip("torchrec")
pytest.importorskip("torchrec.distributed.planner")

import torch  # noqa: E402
from conftest import run_cli  # noqa: E402
from torch import nn  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.types import ShardingPlan  # noqa: E402
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection  # noqa: E402

from neuroshard.costmodels import analytic_cost_models  # noqa: E402
from neuroshard.datasets.families import generate  # noqa: E402
from neuroshard.errors import NeuroShardError  # noqa: E402
from neuroshard.search.api import search_plan  # noqa: E402
from neuroshard.tables import Table, TableSet  # noqa: E402
from neuroshard.torchrec import NeuroShardPlanner, tables_from_module  # noqa: E402

pytestmark = pytest.mark.torchrec

#: 8 tables (name, rows, width): odd row counts, widths that halve (32, 16, 8) and one that cannot (12, 24)
SPEC = [("a", 401, 32), ("b", 57, 8), ("c", 233, 16), ("d", 140, 12), ("e", 300, 16), ("f", 90, 8),
        ("g", 1001, 16), ("h", 77, 24)]
META = torch.device("meta")


def _configs(spec=SPEC, data_type: DataType = DataType.FP32) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"f_{n}"],
                               data_type=data_type) for n, r, d in spec]


class Model(nn.Module):
    """A DLRM-like model: its EmbeddingBagCollection at ``sparse.ebc``, a dense layer beside."""

    def __init__(self, configs: list[EmbeddingBagConfig], device: torch.device = META) -> None:
        super().__init__()
        self.sparse = nn.Module()
        self.sparse.ebc = EmbeddingBagCollection(tables=configs, device=device)
        self.dense = nn.Linear(8, 8, device=device)


def _planner(world: int, memory: int, device: str = "cuda", **kwargs) -> NeuroShardPlanner:
    """A planner over ``world`` ranks with ``memory`` bytes of HBM (cuda) or DDR (cpu) each."""
    cap = {"hbm_cap": memory} if device == "cuda" else {"ddr_cap": memory}
    kwargs.setdefault("cost_models", analytic_cost_models())
    kwargs.setdefault("log_stats", False)
    return NeuroShardPlanner(Topology(world_size=world, compute_device=device, **cap), **kwargs)


def _kinds(plan: ShardingPlan, path: str = "sparse.ebc") -> dict[str, str]:
    return {name: sharding.sharding_type for name, sharding in plan.plan[path].items()}


def _shards(plan) -> list[tuple]:
    return sorted((s.table, s.row_offset, s.num_rows, s.col_offset, s.num_cols, s.device) for s in plan.shards)


# ----------------------------------------------------------------- (a) real DMP, 2 gloo ranks
@pytest.mark.gloo
def test_collective_plan_runs_in_dmp_like_the_unsharded_model(torchrec_interop):
    """Every rank plans with ``collective_plan`` (rank 0 searches, broadcasts): both get the
    same ShardingPlan and ``last_plan``; DMP accepts it, and the pooled outputs and one SGD
    step match the unsharded model. Memory forces a column split; a constraint another."""
    request = torchrec_interop.planner_request(110_000, {"b": {"sharding_types": ["column_wise"]}})
    rank0, rank1 = (results[0] for results in torchrec_interop.run([(SPEC, request)]))
    assert rank0["plan"] == rank1["plan"] and rank0["shards"] == rank1["shards"]
    kinds = {name: record["sharding_type"] for name, record in rank0["plan"]["sparse.ebc"].items()}
    assert set(kinds) == {n for n, _, _ in SPEC} and kinds["b"] == "column_wise"
    assert {"table_wise", "column_wise"} <= set(kinds.values()) <= {"table_wise", "column_wise"}  # cpu: no row-wise
    for result in (rank0, rank1):
        assert result["forward"] < 1e-5 and result["weights"] < 1e-5 and result["after_step"] < 1e-5, result


# ----------------------------------------------------------------- (b) constraints honoured
def test_constraints_and_sharders_are_honoured():
    """On 4 GPUs of 51,000 bytes for the tables, table a (51,328 bytes) must be cut: with
    row-wise forbidden it is column-wise; c pinned to table_wise is whole; g allowed only
    row_wise is row-wise. On CPU the sharder lists no row-wise type, and none is planned."""
    constraints = {"a": ParameterConstraints(sharding_types=["table_wise", "column_wise"]),
                   "c": ParameterConstraints(sharding_types=["table_wise"]),
                   "g": ParameterConstraints(sharding_types=["row_wise"])}
    planner = _planner(4, 60_000, batch_size=64, constraints=constraints)
    kinds = _kinds(planner.plan(Model(_configs()), [EmbeddingBagCollectionSharder()]))
    assert kinds["a"] == "column_wise" and kinds["c"] == "table_wise" and kinds["g"] == "row_wise"
    assert planner.last_plan.table("a").constraints == {"sharding_types": ["table_wise", "column_wise"]}
    assert not planner.last_plan.problems()

    planner = _planner(4, 60_000, "cpu", batch_size=64)
    kinds = _kinds(planner.plan(Model(_configs()), [EmbeddingBagCollectionSharder()]))
    assert kinds["a"] == "column_wise" and set(kinds.values()) <= {"table_wise", "column_wise"}


# ----------------------------------------------------------------- (c) one line naming the table
def _two_ebcs() -> nn.Module:
    model = Model(_configs())
    model.side = nn.Module()
    model.side.ebc = EmbeddingBagCollection(tables=_configs([("a", 10, 8)]), device=META)
    return model


def _with_ec() -> nn.Module:
    model = Model(_configs())
    model.seq = EmbeddingCollection(tables=[EmbeddingConfig(name="s", num_embeddings=10, embedding_dim=8,
                                                            feature_names=["f_s"])], device=META)
    return model


def _mixed_precision() -> nn.Module:
    return Model(_configs(SPEC[:3]) + _configs([("lowp", 50, 8)], DataType.FP16))


@pytest.mark.parametrize("constraints, model, device, match", [
    ({"b": ParameterConstraints(compute_kernels=["dense"])}, None, "cuda", r"table 'b'.*exclude 'fused'"),
    ({"b": ParameterConstraints(sharding_types=["row_wise"])}, None, "cpu", r"table 'b'.*no sharding type is left"),
    ({"b": ParameterConstraints(sharding_types=["table_column_wise"])}, None, "cuda", r"table 'b'.*no sharding type"),
    ({"b": ParameterConstraints(sharding_types=["diagonal"])}, None, "cuda", r"table 'b'.*not a TorchRec sharding"),
    ({"a": ParameterConstraints(min_partition=8)}, None, "cuda", r"table 'a'.*min_partition 8"),
    ({"b": ParameterConstraints(batch_sizes=[3])}, None, "cuda", r"table 'b'.*batch_sizes"),
    ({"zz": ParameterConstraints()}, None, "cuda", r"table 'zz'"),
    # a 12-wide table (no column split) larger than a device, on CPU (no row-wise sharder type)
    ({}, lambda: Model(_configs([("w", 1500, 12), ("b", 57, 8)])), "cpu", r"table 'w'"),
    ({}, _two_ebcs, "cuda", r"table 'a' is in two EmbeddingBagCollections, module 'sparse.ebc' and module 'side.ebc'"),
    ({}, _with_ec, "cuda", r"module 'seq' is an EmbeddingCollection"),
    ({}, _mixed_precision, "cuda", r"table 'lowp' has weights precision 2 but table 'a' has 4"),
], ids=["kernel-dense", "row-wise-on-cpu", "table-column-wise", "unknown-type", "min-partition", "batch-sizes",
        "unknown-table", "too-big-without-row-wise", "same-name-twice", "embedding-collection", "mixed-precision"])
def test_what_cannot_be_honoured_is_one_line_naming_the_table(constraints, model, device, match):
    planner = _planner(2, 60_000, device, batch_size=64, constraints=constraints)
    with pytest.raises(NeuroShardError, match=match) as caught:
        planner.plan(model() if model else Model(_configs()), [EmbeddingBagCollectionSharder()])
    assert "\n" not in str(caught.value)


def test_bad_arguments_are_one_line():
    with pytest.raises(NeuroShardError, match="no sharder"):
        _planner(2, 10**6).plan(Model(_configs()), [])
    with pytest.raises(NeuroShardError, match="storage_reservation"):
        _planner(2, 10**6, storage_reservation=1.5)
    with pytest.raises(NeuroShardError, match="'optimizer' comes from TorchRec"):
        _planner(2, 10**6, optimizer="adam")
    with pytest.raises(NeuroShardError, match="collective_plan needs torch.distributed"):
        _planner(2, 10**6).collective_plan(Model(_configs()), [EmbeddingBagCollectionSharder()])


# ----------------------------------------------------------------- (d) the tables of a model
def test_tables_from_module_reads_every_ebc_with_its_path(tmp_path):
    """Two EBCs; pooling factors from constraints (two features summed), from an access file,
    or the default; access statistics from the file; the batch is per rank x world; the
    sharders' types become the tables' constraints."""
    model = Model(_configs(SPEC[:3]))
    model.side = nn.Module()
    model.side.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name="x", num_embeddings=20, embedding_dim=8, feature_names=["x1", "x2"], data_type=DataType.FP16)],
        device=META)
    access = tmp_path / "access.json"
    TableSet("stats", [Table("a", 401, 32, 5.0, {"zipf_alpha": 1.1}), Table("other", 5, 4, 9.0)]).write(access)
    constraints = {"x": ParameterConstraints(pooling_factors=[2.0, 3.0], num_poolings=[1.0, 2.0])}
    tables = tables_from_module(model, constraints, batch_size=6, world_size=2, access=access,
                                sharding_types={"side.ebc": ["table_wise", "column_wise", "table_column_wise"]})
    assert [t.name for t in tables] == ["a", "b", "c", "x"] and tables.batch_size == 12
    a, b, _, x = tables
    assert (a.num_embeddings, a.embedding_dim, a.pooling_factor, a.access) == (401, 32, 5.0, {"zipf_alpha": 1.1})
    assert (b.pooling_factor, b.access, b.constraints) == (1.0, {}, {})
    assert x.pooling_factor == 2.0 * 1.0 + 3.0 * 2.0
    assert x.extra["torchrec"] == {"module": "side.ebc", "features": ["x1", "x2"], "data_type": "FP16"}
    assert x.constraints == {"sharding_types": ["table_wise", "column_wise"]}
    info = tables.extra["torchrec"]
    assert info["modules"] == ["sparse.ebc", "side.ebc"] and info["batch_size_per_rank"] == 6
    assert info["defaults"] == {"pooling_factor": ["b", "c"], "access": ["b", "c", "x"]}
    assert tables_from_module(Model(_configs())).batch_size == 512  # TorchRec's default batch per rank


# ----------------------------------------------------------------- (e) the same plan as search_plan()
def test_plan_is_what_shard_writes_for_the_same_tables():
    """The planner's plan equals, shard for shard, ``shard``'s for tables built by hand:
    the same devices, memory (capacity x 0.85), batch (per rank x world), cost models and seed."""
    models = analytic_cost_models()
    planner = _planner(4, 60_000, batch_size=64, cost_models=models, seed=3)
    sharding_plan = planner.plan(Model(_configs()), [EmbeddingBagCollectionSharder()])
    tables = TableSet("by-hand", [Table(n, r, d, 1.0) for n, r, d in SPEC], 64 * 4)
    expected = search_plan(tables, 4, int(60_000 * 0.85), cost_models=models, seed=3)
    assert _shards(planner.last_plan) == _shards(expected)
    assert planner.last_plan.estimate["max_device_cost_ms"] == expected.estimate["max_device_cost_ms"]
    ranks = {name: sorted(sharding.ranks) for name, sharding in sharding_plan.plan["sparse.ebc"].items()}
    assert ranks == {n: sorted(s.device for s in expected.shards_of(n)) for n, _, _ in SPEC}


def test_criteo_kaggle_on_the_meta_device_plans_as_shard_does():
    """The 26 Criteo Kaggle tables (10M rows the largest) as an EBC on the meta device, their
    pooling factors and Zipf statistics from ``access``, on 8 GPUs of 512 MiB: the plan
    ``shard`` writes for the preset's tables."""
    tables = generate("criteo-kaggle", None, 0)
    configs = [EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                  feature_names=[t.extra["feature"]]) for t in tables]
    models = analytic_cost_models()
    planner = _planner(8, 512 * 2**20, batch_size=tables.batch_size // 8, cost_models=models, access=tables)
    sharding_plan = planner.plan(Model(configs), [EmbeddingBagCollectionSharder()])
    expected = search_plan(tables, 8, int(512 * 2**20 * 0.85), cost_models=models)
    assert _shards(planner.last_plan) == _shards(expected)
    assert len(sharding_plan.plan["sparse.ebc"]) == 26
    assert [t.access for t in planner.last_plan.tables] == [t.access for t in tables]


# ----------------------------------------------------------------- stats, last_plan, import
def test_stats_are_logged_and_last_plan_is_a_plan_file(tmp_path, caplog):
    """With the shipped cost models: per rank the shards, cost, memory and all-to-all bytes,
    the defaults used and what the estimate is for, on logger neuroshard.torchrec (none with
    log_stats=False); ``last_plan`` written is what ``neuroshard plan show`` reads."""
    planner = NeuroShardPlanner(Topology(world_size=2, compute_device="cpu", ddr_cap=10**6), batch_size=256)
    with caplog.at_level(logging.INFO, logger="neuroshard.torchrec"):
        planner.plan(Model(_configs()), [EmbeddingBagCollectionSharder()])
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "neuroshard.torchrec")
    assert "batch of 512 (256 per rank x 2)" in text and "cost model 'cpu-default'" in text
    assert "default access statistics (uniform lookups) for a, b, c" in text
    assert "rank 0: cost" in text and "rank 1: cost" in text and "all-to-all" in text and "a 401x32" in text
    # TorchRec's own planner on the same task, scored by the same models, beside ours
    assert "TorchRec's EmbeddingShardingPlanner on the same task" in text
    assert "scored by the same cost model: max rank cost" in text or "no plan (" in text
    # and kept on the planner, whatever the logging: the logged line is its format()
    comparison = planner.last_comparison
    assert comparison is not None and comparison.format() in text
    assert comparison.ours_ms == planner.last_plan.estimate["max_device_cost_ms"]
    assert comparison.our_shards == len(planner.last_plan.shards)
    if comparison.theirs_ms is not None:
        assert comparison.ratio == pytest.approx(comparison.ours_ms / comparison.theirs_ms)
        assert f"{comparison.ratio:.3f}x" in comparison.format()
    else:
        assert comparison.ratio is None and comparison.no_plan
    path = planner.last_plan.write(tmp_path / "plan.json")
    shown = run_cli("plan", "show", path)
    assert shown.returncode == 0 and "8 tables" in shown.stdout, shown.stderr

    caplog.clear()
    quiet = _planner(2, 10**6, log_stats=False)
    with caplog.at_level(logging.INFO, logger="neuroshard.torchrec"):
        quiet.plan(Model(_configs()), [EmbeddingBagCollectionSharder()])
    assert not [r for r in caplog.records if r.name == "neuroshard.torchrec"]
    assert quiet.last_comparison is None  # compare_torchrec follows log_stats unless given
    kept = _planner(2, 10**6, log_stats=False, compare_torchrec=True)
    with caplog.at_level(logging.INFO, logger="neuroshard.torchrec"):
        kept.plan(Model(_configs()), [EmbeddingBagCollectionSharder()])
    assert kept.last_comparison is not None and kept.last_comparison.our_shards == len(kept.last_plan.shards)
    assert not [r for r in caplog.records if r.name == "neuroshard.torchrec"]


def test_the_package_loads_the_planner_on_first_use_only():
    """``neuroshard.torchrec`` (and the exporter ``neuroshard export`` reads) imports without
    loading the planner module, its torch and its search; without TorchRec, asking for the
    planner is a one-line NeuroShardError."""
    code = ("import sys, neuroshard.torchrec, neuroshard.torchrec.export; "
            "assert 'neuroshard.torchrec.sharding_planner' not in sys.modules; "
            "assert 'neuroshard.search.api' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    code = ("import sys; sys.modules['torchrec'] = None\n"  # TorchRec not importable
            "import neuroshard.torchrec as t\n"
            "from neuroshard.errors import NeuroShardError\n"
            "try:\n    t.NeuroShardPlanner\nexcept NeuroShardError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True)
    assert out.stdout.startswith("this needs TorchRec"), out.stderr


def test_hosts_per_device_memory_and_optimizer_come_from_torchrec():
    """Two hosts of 2 GPUs: the plan states them (placements ``cuda:(R mod 2)``); one GPU with
    less HBM is planned with less; the optimizer attached in backward counts in memory."""
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    topology = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=200_000)
    topology.devices[3].storage.hbm = 100_000
    model = Model(_configs())
    apply_optimizer_in_backward(torch.optim.Adagrad, model.sparse.ebc.parameters(), {"lr": 0.1})
    planner = NeuroShardPlanner(topology, 64, cost_models=analytic_cost_models(), log_stats=False)
    sharding_plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    plan = planner.last_plan
    assert plan.local_world_size == 2 and plan.topology.num_hosts == 2
    assert plan.memory_limits() == [170_000, 170_000, 170_000, 85_000] and plan.optimizer == "adagrad"
    assert max(plan.memory_used_bytes()) <= 170_000 and plan.memory_used_bytes()[3] <= 85_000
    placements = {str(m.placement) for s in sharding_plan.plan["sparse.ebc"].values() for m in s.sharding_spec.shards}
    assert placements <= {"rank:0/cuda:0", "rank:1/cuda:1", "rank:2/cuda:0", "rank:3/cuda:1"}


def test_takes_embedding_sharding_planner_arguments_as_written(caplog):
    """The signature of TorchRec's EmbeddingShardingPlanner, positional order included: a
    script's constructor call works unchanged; TorchRec's search parts are ignored with one
    warning naming them, and storage_reservation=None is TorchRec's default (0.15)."""
    import inspect

    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    theirs = list(inspect.signature(EmbeddingShardingPlanner.__init__).parameters)
    ours = list(inspect.signature(NeuroShardPlanner.__init__).parameters)
    assert ours[:len(theirs)] == theirs
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=10**6)
    constraints = {"a": ParameterConstraints(sharding_types=["table_wise"])}
    with caplog.at_level(logging.WARNING, logger="neuroshard.torchrec"):
        planner = NeuroShardPlanner(topology, 256, None, FixedPercentageStorageReservation(0.15), None, None,
                                    None, None, constraints, True, None, 60, cost_models=analytic_cost_models(),
                                    log_stats=False)
    assert [r.getMessage() for r in caplog.records if "ignores timeout_seconds" in r.getMessage()]
    plan = planner.plan(Model(_configs()), [EmbeddingBagCollectionSharder()])
    assert _kinds(plan)["a"] == "table_wise"
    default = _planner(2, 10**6, device="cpu", storage_reservation=None)
    assert default._memory() == int(10**6 * 0.85)


@pytest.mark.gloo
def test_the_readme_lines_run_as_written_in_dmp(torchrec_interop):
    """The README's "TorchRec users: three lines" block, executed as written on 2 gloo ranks
    (only DistributedModelParallel is told to use this CPU process group): the model it
    builds computes what the unsharded model computes."""
    request = torchrec_interop.planner_request(110_000, readme=True)
    rank0, rank1 = (results[0] for results in torchrec_interop.run([(SPEC, request)]))
    assert rank0["plan"] == rank1["plan"] and set(rank0["plan"]["sparse.ebc"]) == {n for n, _, _ in SPEC}
    for result in (rank0, rank1):
        assert result["forward"] < 1e-5 and result["weights"] < 1e-5 and result["after_step"] < 1e-5, result
