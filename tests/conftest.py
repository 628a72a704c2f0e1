"""Shared fixtures and helpers. No test module imports another: what two modules share lives here.

Markers (registered in pyproject.toml; ``make test-fast`` deselects all four):

* ``gloo``: starts real torch.distributed gloo processes;
* ``timing``: times real kernels on this machine (measurement, calibration, refine,
  measured-greedy, the demo);
* ``torchrec``: needs TorchRec installed (real TorchRec objects or its planner);
* ``slow``: anything else that takes more than about 3 s.

Fixtures: small tables (``tables_file``), cost models (``analytic_models``, ``shipped_models``),
the checked-in reference data (``reference_data``: tests/data), measured folders
(``measured_folders``: real kernels and gloo, once per session), the runtime's small task
(``runtime_tables``, ``runtime_plan``) and TorchRec interoperability (``torchrec_interop``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuroshard.constants import FLUSH_BYTES_ENV
from neuroshard.costmodels import analytic_cost_models, load_cost_models
from neuroshard.costmodels.base import CommSamples, CostModels
from neuroshard.execution.launch import free_port
from neuroshard.measured.collect import collect_comm, collect_compute
from neuroshard.plan import Plan, Shard
from neuroshard.search.registry import ALGORITHMS
from neuroshard.tables import Table, TableSet
from neuroshard.torchrec.export import qcomms_config, to_parameter_shardings, torchrec_sharding
from neuroshard.types import ceil_blocks

# The suite checks flows, not figures: a small cache flush before each timed kernel run (set before any
# process starts, so the gloo and CLI subprocesses inherit it) instead of 1.25x the last-level cache,
# which on a VM reporting a whole host's cache is 393 MB and 30 ms a run (the refine CLI test then
# passed 900 s in CI). A flush set by the caller stays.
os.environ.setdefault(FLUSH_BYTES_ENV, str(8 << 20))

DATA = Path(__file__).resolve().parent / "data"
HISTOGRAM = [0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0.001, 0, 0, 0, 0, 0, 0]


@pytest.fixture(scope="session", autouse=True)
def fresh_cache_home(tmp_path_factory) -> Path:
    """``XDG_CACHE_HOME`` is a fresh folder for the whole session (subprocesses inherit it): cost
    models pre-trained on the developer's machine (``pretrain --here``) or calibrations cached
    there never reach a test, and no test writes into the developer's cache."""
    with pytest.MonkeyPatch.context() as patch:
        home = tmp_path_factory.mktemp("xdg-cache")
        patch.setenv("XDG_CACHE_HOME", str(home))
        yield home


# --------------------------------------------------------------------- tables
def tables_dict(**overrides) -> dict:
    data = {
        "format": "neuroshard.tables/v1",
        "name": "small",
        "batch_size": 512,
        "tables": [
            {"name": "t0", "num_embeddings": 4000, "embedding_dim": 32, "pooling_factor": 3.0,
             "access": {"zipf_alpha": 1.05}},
            {"name": "t1", "num_embeddings": 3000, "embedding_dim": 16, "pooling_factor": 1.0,
             "access": {"reuse_histogram": HISTOGRAM, "mean_reuse": 6.9}},
            {"name": "t2", "num_embeddings": 500, "embedding_dim": 8, "pooling_factor": 5.0},
        ],
    }
    data.update(overrides)
    return data


@pytest.fixture
def tables_file(tmp_path: Path) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(tables_dict()))
    return path


# --------------------------------------------------------------- algorithms
def algorithm_params(names: tuple[str, ...] = ALGORITHMS) -> list:
    """The algorithms as ``pytest.param``s marked with what they need: ``torchrec`` (TorchRec's
    planner) and ``timing`` (measured-greedy times real kernels)."""
    marks = {"torchrec": [pytest.mark.torchrec], "measured-greedy": [pytest.mark.timing]}
    return [pytest.param(name, marks=marks.get(name, []), id=name) for name in names]


# --------------------------------------------------------------- cost models
@pytest.fixture
def analytic_models() -> CostModels:
    """The analytic cost models with their default constants (cheap: a fresh bundle per test)."""
    return analytic_cost_models()


@pytest.fixture(scope="module")
def shipped_models() -> CostModels:
    """The shipped checkpoint (or the analytic models where the tree has none), loaded once per
    module: its tests share it, and none may change it."""
    return load_cost_models()


@pytest.fixture(scope="session")
def reference_data() -> dict:
    """tests/data/cpu-default-v1.predictions.json: 60 feature sets of dlrm-2021 shards with the
    compute ms the v1 checkpoint predicted for them (``sets``, ``compute_ms``), and its
    communication predictions as ``CommSamples`` at 2, 3, 4, 8 and 16 devices (``comm``)."""
    raw = json.loads((DATA / "cpu-default-v1.predictions.json").read_text())
    comm = [CommSamples(r["widths"], r["skews_ms"], r["fwd_ms"], r["bwd_ms"], r["reduce_width"], r["reduce_ms"])
            for _, r in sorted(raw["comm"].items(), key=lambda kv: int(kv[0]))]
    return {"raw": raw, "sets": [np.asarray(s, dtype=np.float32) for s in raw["sets"]],
            "compute_ms": np.asarray(raw["compute_ms"], dtype=np.float64), "comm": comm}


@pytest.fixture(scope="session")
def measured_folders(tmp_path_factory) -> dict[str, Path]:
    """A tables file of 14 varied tables, 200 measured shard sets of them (real kernels) and
    24 two-device all-to-all samples (real gloo processes), measured once per session.
    Tests using it are marked ``timing`` and ``gloo``."""
    root = tmp_path_factory.mktemp("cost-data")
    tables = []
    for i in range(14):
        access = [{"zipf_alpha": 0.6 + 0.1 * i}, {"reuse_histogram": HISTOGRAM, "mean_reuse": 6.9}, {}][i % 3]
        tables.append({"name": f"t{i}", "num_embeddings": [500, 3000, 20000, 100000][i % 4],
                       "embedding_dim": [16, 64, 128][i % 3], "pooling_factor": [1.0, 4.0, 12.0, 40.0, 0.5][i % 5],
                       "access": access})
    (root / "tables.json").write_text(json.dumps({"format": "neuroshard.tables/v1", "name": "cm", "batch_size": 512,
                                                  "tables": tables}))
    collect_compute(root / "tables.json", 200, root / "compute", max_tables=4, batch_size=1024,
                    dims=(8, 16, 32, 64, 128),
                    max_rows=20000, warmup=1, repeats=3, max_repeats=3, flush_bytes=1 << 20, progress=False)
    collect_comm(2, 24, root / "comm2", batch_size=512, max_width=128, max_skew_ms=2.0, repeats=3, warmup=1,
                 progress=False)
    return {"compute": root / "compute", "comm2": root / "comm2"}


# ------------------------------------------------------------------ runtime
def tiered_tables(n: int = 12, rows: int = 200_000, batch: int = 4096) -> TableSet:
    """``n`` zipf tables of ``rows`` to 3x ``rows`` rows, 32 wide: what the memory-tier tests
    overflow the devices with (``TableSet.total_bytes`` sizes them)."""
    tables = [Table(f"t{i}", rows * (1 + i % 3), 32, 2.0 + i % 4, {"zipf_alpha": 0.8 + 0.1 * (i % 5)})
              for i in range(n)]
    return TableSet("tiered", tables, batch_size=batch)


def _runtime_tables() -> list[Table]:
    return [
        Table("t0", 300, 16, 3.0, {"zipf_alpha": 1.1}),
        Table("t1", 200, 8, 1.0),
        Table("t2", 250, 16, 2.0, {"zipf_alpha": 0.9, "row_order": "hottest_first"}),
        Table("t3", 180, 8, 2.5),
        Table("t4", 320, 16, 1.5, {"zipf_alpha": 1.2}),
    ]


def _row_blocks(t: Table, n: int, col_offset: int = 0, num_cols: int | None = None,
                first_device: int = 0) -> list[Shard]:
    cuts = np.linspace(0, t.num_embeddings, n + 1).astype(int)
    num_cols = t.embedding_dim if num_cols is None else num_cols
    return [Shard(t.name, int(a), int(b - a), col_offset, num_cols, (first_device + i) % n)
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]


def _col_strips(t: Table, n: int, first_device: int = 0) -> list[Shard]:
    cuts = np.linspace(0, t.embedding_dim, n + 1).astype(int)
    return [Shard(t.name, 0, t.num_embeddings, int(a), int(b - a), (first_device + i) % n)
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]


def _runtime_plan(kind: str, n: int) -> Plan:
    tables = _runtime_tables()
    shards: list[Shard] = []
    for i, t in enumerate(tables):
        if kind == "table_wise":
            shards.append(Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % n))
        elif kind == "column_wise":
            shards += _col_strips(t, n, first_device=i)
        elif kind == "row_wise":
            shards += _row_blocks(t, n, first_device=i)
        elif i == 0:  # mixed: t0 split along rows and columns
            half = t.embedding_dim // 2
            shards += _row_blocks(t, n, 0, half) + _row_blocks(t, n, half, half, first_device=1)
        elif i == 1:
            shards += _col_strips(t, n)
        elif i == 2:
            shards += _row_blocks(t, n, first_device=1)
        else:
            shards.append(Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % n))
    plan = Plan(tables, shards, n, 10**9).validate()
    assert {plan.sharding_type(t.name) for t in tables} >= ({"grid_shard"} if kind == "mixed" else {kind})
    return plan


@pytest.fixture(scope="module")
def runtime_tables() -> list[Table]:
    """Five small tables (180-320 rows, widths 8 and 16) the CPU runtime trains in seconds
    (one list per module: do not change them)."""
    return _runtime_tables()


@pytest.fixture
def runtime_plan():
    """``make(kind, devices)``: a valid plan of ``runtime_tables`` whose tables are all
    ``kind`` (table_wise, column_wise, row_wise), or ``mixed`` (one table split along rows
    and columns, one column-wise, one row-wise, the rest whole)."""
    return _runtime_plan


# -------------------------------------------------------------- processes
def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real `neuroshard` command in a subprocess (``env``: variables added to this one's)."""
    return subprocess.run([sys.executable, "-m", "neuroshard.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=None if env is None else {**os.environ, **env})


def run_ranks(target, world: int, args: tuple, timeout: float) -> dict:
    """Start ``world`` spawned processes ``target(rank, port, *args, results)`` on one free
    port; return what each put on ``results`` as ``{rank: value}`` (a string: its error)."""
    import torch.multiprocessing
    ctx = torch.multiprocessing.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(world):
            rank, value = results.get(timeout=timeout)
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for rank, value in got.items():
        assert not isinstance(value, str), f"rank {rank}: {value}"
    return got


# ---------------------------------------------------------------- TorchRec
INTEROP_BATCH, INTEROP_LR = 6, 0.5


def _torchrec_worker(rank: int, port: int, world: int, local_world_size: int, documents: list[tuple[list, dict]],
                     results) -> None:
    """One rank of ``TorchRecInterop.run`` (a spawned process): every (tables, exported plan)
    compared in DistributedModelParallel; puts ``(rank, [result per document])`` or an error string."""
    try:
        import logging
        import warnings
        warnings.simplefilter("ignore")
        logging.getLogger("torchrec").setLevel(logging.ERROR)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(local_world_size))
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        out = [_torchrec_compare(rank, world, [Table(n, rows, dim, 1.0) for n, rows, dim in spec], doc)
               for spec, doc in documents]
        dist.destroy_process_group()
        results.put((rank, out))
    except BaseException as exc:  # report, never hang the parent
        import traceback
        results.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _qcomms(doc: dict):
    """The export's reduced-precision communication as TorchRec's codecs (None: fp32)."""
    import torch
    from torchrec.distributed.fbgemm_qcomm_codec import get_qcomm_codecs_registry
    config = qcomms_config(doc)
    return None if config is None else get_qcomm_codecs_registry(config, device=torch.device("cpu"))


def readme_torchrec_lines() -> str:
    """The README's "TorchRec users: three lines" block, as written."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return next(b for b in blocks if "NeuroShardPlanner(" in b)


def _torchrec_compare(rank: int, world: int, tables: list[Table], doc: dict) -> dict:
    """Max abs difference between the exported plan in DistributedModelParallel and the
    unsharded EmbeddingBagCollection built from the same weights: of the pooled outputs
    (``forward``), of the weights after one SGD step (``weights``), and of the outputs
    after it (``after_step``). ``doc`` may instead be ``TorchRecInterop.planner_request``'s:
    the plan is then ``NeuroShardPlanner.collective_plan``'s for the model with its EBC at
    ``doc["path"]``, and the result adds it (``plan``: TorchRec's plan as JSON, ``shards``:
    ``last_plan``'s shards)."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingEnv, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


    batch_size, lr = INTEROP_BATCH, INTEROP_LR
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                                  feature_names=[f"f_{t.name}"]) for t in tables]
    features = [f"f_{t.name}" for t in tables]

    def batch(r: int, step: int) -> KeyedJaggedTensor:
        g = torch.Generator().manual_seed(1000 * step + r)
        lengths = torch.randint(0, 4, (len(tables) * batch_size,), generator=g)
        ids = torch.cat([torch.randint(0, t.num_embeddings, (int(n),), generator=g)
                         for t, n in zip(tables, lengths.view(len(tables), batch_size).sum(1))])
        return KeyedJaggedTensor.from_lengths_sync(features, ids, lengths)

    def grad_weights(r: int) -> torch.Tensor:
        return torch.randn(batch_size, sum(t.embedding_dim for t in tables),
                           generator=torch.Generator().manual_seed(77 + r))

    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    full = {k: v.detach().clone() for k, v in reference.state_dict().items()}

    path = doc.get("path", "ebc")  # where the model holds its EmbeddingBagCollection

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            holder = self
            for name in path.split(".")[:-1]:
                holder.add_module(name, torch.nn.Module())
                holder = getattr(holder, name)
            holder.add_module(path.split(".")[-1], EmbeddingBagCollection(tables=configs, device=torch.device("cpu")))

        def forward(self, kjt: KeyedJaggedTensor):
            return self.get_submodule(path)(kjt)

    model = Model()
    apply_optimizer_in_backward(torch.optim.SGD, model.get_submodule(path).parameters(), {"lr": lr})
    sizes = {t.name: (t.num_embeddings, t.embedding_dim) for t in tables}
    sharders = [EmbeddingBagCollectionSharder(qcomm_codecs_registry=_qcomms(doc))]
    planned, built = {}, None  # built: the DMP the README's lines made
    if "planner" in doc:  # NeuroShardPlanner plans on rank 0 and broadcasts
        from torchrec.distributed.planner import ParameterConstraints, Topology

        from neuroshard.torchrec import NeuroShardPlanner
        from neuroshard.torchrec.import_plan import sharding_plan_json
        options = dict(doc["planner"])
        constraints = {name: ParameterConstraints(**rule) for name, rule in options.pop("constraints", {}).items()}
        topology = Topology(world_size=world, compute_device="cpu", ddr_cap=options.pop("ddr_cap"))
        if options.pop("readme", False):  # the README's lines, exactly as written (defaults: the shipped models)
            made = {}

            def on_cpu(module, plan, sharders):  # the README's DMP call, on this CPU process group
                made["plan"] = plan
                return DistributedModelParallel(module, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                                device=torch.device("cpu"), plan=plan, sharders=sharders)

            scope = {"topology": topology, "batch_size": batch_size, "constraints": constraints, "model": model,
                     "sharders": sharders, "pg": dist.group.WORLD, "DistributedModelParallel": on_cpu}
            exec(readme_torchrec_lines(), scope)
            plan, planner, built = made["plan"], scope["planner"], scope["model"]
        else:
            planner = NeuroShardPlanner(topology, batch_size, constraints=constraints,
                                        cost_models=analytic_cost_models(), log_stats=False, **options)
            plan = planner.collective_plan(model, sharders, dist.group.WORLD)
        planned = {"plan": sharding_plan_json(plan), "shards": [s.to_dict() for s in planner.last_plan.shards]}
    else:
        plan = ShardingPlan({"ebc": EmbeddingModuleShardingPlan(to_parameter_shardings(doc, sizes))})
    dmp = built or DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=plan, sharders=sharders)

    def local_parts(value) -> list[tuple[int, int, torch.Tensor]]:
        """(row offset, column offset, tensor) of this rank's shards; a data-parallel table's
        state is its whole replica."""
        if isinstance(value, torch.Tensor) and not hasattr(value, "local_shards"):
            return [(0, 0, value)]
        return [(*s.metadata.shard_offsets, s.tensor) for s in value.local_shards()]

    for key, value in dmp.state_dict().items():  # the reference's weights into the shards
        name = key.split(f"{path}.", 1)[1]
        for r0, c0, part in local_parts(value):
            part.detach().copy_(full[name][r0:r0 + part.shape[0], c0:c0 + part.shape[1]])

    def reference_pooled(kjt: KeyedJaggedTensor) -> torch.Tensor:
        result = reference(kjt).to_dict()
        return torch.cat([result[f] for f in features], dim=1)

    def sharded_pooled(kjt: KeyedJaggedTensor) -> torch.Tensor:
        result = dmp(kjt)  # through DMP's data-parallel wrapper (DDP), which all-reduces replicated tables
        result = (result.wait() if hasattr(result, "wait") else result).to_dict()
        return torch.cat([result[f] for f in features], dim=1)

    kjt = batch(rank, 0)
    pooled = sharded_pooled(kjt)
    fwd = float((pooled - reference_pooled(kjt)).abs().max())
    # one step: TorchRec averages the gradients of all ranks' batches (as DDP does)
    (pooled * grad_weights(rank)).sum().backward()
    # replicated tables keep their gradient (DDP averaged it) for the dense optimizer, as in TorchRec training
    dense = [p for p in dmp.parameters() if p.grad is not None]
    if dense:
        torch.optim.SGD(dense, lr=lr).step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    ref_opt.zero_grad()
    loss = sum((reference_pooled(batch(r, 0)) * grad_weights(r)).sum() for r in range(world)) / world
    loss.backward()
    ref_opt.step()
    weights = 0.0
    for key, value in dmp.state_dict().items():
        name = key.split(f"{path}.", 1)[1]
        ref = reference.state_dict()[name]
        for r0, c0, part in local_parts(value):
            weights = max(weights, float((part - ref[r0:r0 + part.shape[0], c0:c0 + part.shape[1]]).abs().max()))
    kjt = batch(rank, 1)
    with torch.no_grad():
        after = float((sharded_pooled(kjt) - reference_pooled(kjt)).abs().max())
    return {"forward": fwd, "weights": weights, "after_step": after, **planned}


class TorchRecInterop:
    """Exported plans run in real TorchRec: small tables, hand-made plans of each layout on
    ``WORLD`` ranks, the export as JSON, and ``run`` (DistributedModelParallel on gloo
    processes; see ``_torchrec_compare``)."""

    WORLD = 2

    def __init__(self) -> None:
        # odd row counts: ceil blocks differ from floor blocks
        self.tables = [Table("a", 101, 16, 2.0), Table("b", 57, 8, 1.0), Table("c", 33, 16, 3.0),
                       Table("d", 40, 12, 1.5)]

    def rows(self, t: Table, devices: list[int], col_offset: int = 0, num_cols: int | None = None) -> list[Shard]:
        """``t``'s rows in TorchRec's ceil blocks over ``devices``."""
        cols = t.embedding_dim if num_cols is None else num_cols
        return [Shard(t.name, lo, n, col_offset, cols, d)
                for (lo, n), d in zip(ceil_blocks(t.num_embeddings, len(devices)), devices)]

    def plan(self, kind: str) -> Plan:
        """A valid plan of ``tables`` on 2 ranks: table_wise, column_wise, row_wise, grid or data_parallel."""
        a, b, c, d = self.tables
        rows = self.rows
        shards = {
            "table_wise": [Shard("a", 0, 101, 0, 16, 1), Shard("b", 0, 57, 0, 8, 0), Shard("c", 0, 33, 0, 16, 1),
                           Shard("d", 0, 40, 0, 12, 0)],
            # uneven widths, two shards of one table on one rank, out of rank order
            "column_wise": [Shard("a", 0, 101, 0, 8, 1), Shard("a", 0, 101, 8, 4, 0), Shard("a", 0, 101, 12, 4, 1),
                            Shard("b", 0, 57, 0, 4, 1), Shard("b", 0, 57, 4, 4, 0),
                            Shard("c", 0, 33, 0, 16, 0), Shard("d", 0, 40, 0, 4, 0), Shard("d", 0, 40, 4, 8, 1)],
            "row_wise": [*rows(a, [0, 1]), *rows(b, [0, 1]), *rows(c, [0, 1]), Shard("d", 0, 40, 0, 12, 1)],
            "grid": [*rows(a, [0, 1], 0, 8), *rows(a, [0, 1], 8, 8), *rows(c, [0, 1], 0, 4),
                     *rows(c, [0, 1], 4, 12), Shard("b", 0, 57, 0, 8, 1), *rows(d, [0, 1])],
            # b replicated on both ranks (TorchRec's data_parallel), the others sharded
            "data_parallel": [Shard("a", 0, 101, 0, 16, 1), *rows(c, [0, 1]), Shard("d", 0, 40, 0, 12, 0)],
        }[kind]
        replicated = ["b"] if kind == "data_parallel" else []
        return Plan(list(self.tables), shards, self.WORLD, 10**6, data_parallel_tables=replicated).validate()

    @staticmethod
    def export(plan: Plan, local_world_size: int | None = None) -> dict:
        """``plan`` exported for TorchRec (CPU), through JSON as a file would carry it."""
        return json.loads(json.dumps(torchrec_sharding(plan, compute_device="cpu", local_world_size=local_world_size)))

    @staticmethod
    def planner_request(ddr_cap: int, constraints: dict | None = None, path: str = "sparse.ebc",
                        **options) -> dict:
        """A document for ``run`` that has every rank plan with ``NeuroShardPlanner.collective_plan``
        (CPU topology of ``ddr_cap`` per rank, the batch of ``run``, analytic cost models) for a
        model holding its EBC at ``path``; ``constraints``: table -> ParameterConstraints' keyword
        arguments; ``options``: the planner's other keyword arguments."""
        return {"planner": {"ddr_cap": ddr_cap, "constraints": constraints or {}, **options}, "path": path}

    @staticmethod
    def spec(tables) -> list[tuple[str, int, int]]:
        """Tables as (name, rows, dim), what the ranks rebuild them from."""
        return [(t.name, t.num_embeddings, t.embedding_dim) for t in tables]

    def run(self, documents: list[tuple[list, dict]], world: int | None = None, local_world_size: int | None = None,
            timeout: float = 120) -> list[list[dict]]:
        """Each (spec, exported plan) run on ``world`` gloo processes; per rank, one
        ``_torchrec_compare`` result per document."""
        world = world or self.WORLD
        got = run_ranks(_torchrec_worker, world, (world, local_world_size or world, documents), timeout=timeout)
        return [got[r] for r in range(world)]


@pytest.fixture
def torchrec_interop() -> TorchRecInterop:
    """TorchRec interoperability helpers (skips the test where TorchRec's planner is not importable)."""
    pytest.importorskip("torchrec.distributed.planner")
    return TorchRecInterop()
