"""Exported plans applied in real TorchRec: an EmbeddingBagCollection sharded by
DistributedModelParallel on 2 gloo processes (CPU, fused kernel) gives the same pooled
outputs, and after one SGD step the same weights, as the unsharded model built from
the same weights."""
from __future__ import annotations

import json
import os

import pytest

torchrec = pytest.importorskip("torchrec")
pytest.importorskip("torchrec.distributed.planner")

import torch  # noqa: E402

from neuroshard.errors import NeuroShardError  # noqa: E402
from neuroshard.plan import Plan, Shard  # noqa: E402
from neuroshard.torchrec.export import torchrec_sharding  # noqa: E402
from neuroshard.types import ceil_blocks  # noqa: E402
from neuroshard.tables import Table, TableSet  # noqa: E402

from conftest import run_ranks  # noqa: E402

WORLD, BATCH, LR = 2, 6, 0.5
# odd row counts: ceil blocks differ from floor blocks
TABLES = [Table("a", 101, 16, 2.0), Table("b", 57, 8, 1.0), Table("c", 33, 16, 3.0), Table("d", 40, 12, 1.5)]


def _rows(t: Table, devices: list[int], col_offset: int = 0, num_cols: int | None = None) -> list[Shard]:
    cols = t.embedding_dim if num_cols is None else num_cols
    return [Shard(t.name, lo, n, col_offset, cols, d)
            for (lo, n), d in zip(ceil_blocks(t.num_embeddings, len(devices)), devices)]


def _plan(kind: str) -> Plan:
    a, b, c, d = TABLES
    shards = {
        "table_wise": [Shard("a", 0, 101, 0, 16, 1), Shard("b", 0, 57, 0, 8, 0), Shard("c", 0, 33, 0, 16, 1),
                       Shard("d", 0, 40, 0, 12, 0)],
        # uneven widths, two shards of one table on one rank, out of rank order
        "column_wise": [Shard("a", 0, 101, 0, 8, 1), Shard("a", 0, 101, 8, 4, 0), Shard("a", 0, 101, 12, 4, 1),
                        Shard("b", 0, 57, 0, 4, 1), Shard("b", 0, 57, 4, 4, 0),
                        Shard("c", 0, 33, 0, 16, 0), Shard("d", 0, 40, 0, 4, 0), Shard("d", 0, 40, 4, 8, 1)],
        "row_wise": [*_rows(a, [0, 1]), *_rows(b, [0, 1]), *_rows(c, [0, 1]), Shard("d", 0, 40, 0, 12, 1)],
        "grid": [*_rows(a, [0, 1], 0, 8), *_rows(a, [0, 1], 8, 8), *_rows(c, [0, 1], 0, 4),
                 *_rows(c, [0, 1], 4, 12), Shard("b", 0, 57, 0, 8, 1), *_rows(d, [0, 1])],
        # b replicated on both ranks (TorchRec's data_parallel), the others sharded
        "data_parallel": [Shard("a", 0, 101, 0, 16, 1), *_rows(c, [0, 1]), Shard("d", 0, 40, 0, 12, 0)],
    }[kind]
    replicated = ["b"] if kind == "data_parallel" else []
    return Plan(list(TABLES), shards, WORLD, 10**6, data_parallel_tables=replicated).validate()


def _exported(plan: Plan, local_world_size: int | None = None) -> dict:
    return json.loads(json.dumps(torchrec_sharding(plan, compute_device="cpu", local_world_size=local_world_size)))


def _worker(rank: int, port: int, documents: list[tuple[list, dict]], results: "torch.multiprocessing.Queue") -> None:
    try:
        results.put((rank, _apply(rank, port, documents)))
    except BaseException as exc:  # report, never hang the parent
        import traceback
        results.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _apply(rank: int, port: int, documents: list[tuple[list, dict]]) -> list[dict]:
    """Per (tables as (name, rows, dim), exported plan): max abs difference of the forward
    outputs, of the weights after one SGD step, and of the forward outputs after that step."""
    import logging
    import warnings
    warnings.simplefilter("ignore")
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    out = []
    for spec, doc in documents:
        out.append(_compare(rank, [Table(n, rows, dim, 1.0) for n, rows, dim in spec], doc))
    dist.destroy_process_group()
    return out


def _compare(rank: int, tables: list[Table], doc: dict) -> dict:
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingEnv, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from neuroshard.torchrec.export import to_parameter_shardings

    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                                  feature_names=[f"f_{t.name}"]) for t in tables]
    features = [f"f_{t.name}" for t in tables]

    def batch(r: int, step: int) -> KeyedJaggedTensor:
        g = torch.Generator().manual_seed(1000 * step + r)
        lengths = torch.randint(0, 4, (len(tables) * BATCH,), generator=g)
        ids = torch.cat([torch.randint(0, t.num_embeddings, (int(n),), generator=g)
                         for t, n in zip(tables, lengths.view(len(tables), BATCH).sum(1))])
        return KeyedJaggedTensor.from_lengths_sync(features, ids, lengths)

    def grad_weights(r: int) -> torch.Tensor:
        return torch.randn(BATCH, sum(t.embedding_dim for t in tables), generator=torch.Generator().manual_seed(77 + r))

    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    full = {k: v.detach().clone() for k, v in reference.state_dict().items()}

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))

        def forward(self, kjt: KeyedJaggedTensor):
            return self.ebc(kjt)

    model = Model()
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": LR})
    sizes = {t.name: (t.num_embeddings, t.embedding_dim) for t in tables}
    plan = ShardingPlan({"ebc": EmbeddingModuleShardingPlan(to_parameter_shardings(doc, sizes))})
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=plan,
                                   sharders=[EmbeddingBagCollectionSharder(qcomm_codecs_registry=_qcomms(doc))])
    def local_parts(value) -> list[tuple[int, int, torch.Tensor]]:
        """(row offset, column offset, tensor) of this rank's shards; a data-parallel table's
        state is its whole replica."""
        if isinstance(value, torch.Tensor) and not hasattr(value, "local_shards"):
            return [(0, 0, value)]
        return [(*s.metadata.shard_offsets, s.tensor) for s in value.local_shards()]

    for key, value in dmp.state_dict().items():  # the reference's weights into the shards
        name = key.split("ebc.", 1)[1]
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
    # one step: TorchRec averages the gradients of both ranks' batches (as DDP does)
    (pooled * grad_weights(rank)).sum().backward()
    # replicated tables keep their gradient (DDP averaged it) for the dense optimizer, as in TorchRec training
    dense = [p for p in dmp.parameters() if p.grad is not None]
    if dense:
        torch.optim.SGD(dense, lr=LR).step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    ref_opt.zero_grad()
    loss = sum((reference_pooled(batch(r, 0)) * grad_weights(r)).sum() for r in range(WORLD)) / WORLD
    loss.backward()
    ref_opt.step()
    weights = 0.0
    for key, value in dmp.state_dict().items():
        name = key.split("ebc.", 1)[1]
        ref = reference.state_dict()[name]
        for r0, c0, part in local_parts(value):
            weights = max(weights, float((part - ref[r0:r0 + part.shape[0], c0:c0 + part.shape[1]]).abs().max()))
    kjt = batch(rank, 1)
    with torch.no_grad():
        after = float((sharded_pooled(kjt) - reference_pooled(kjt)).abs().max())
    return {"forward": fwd, "weights": weights, "after_step": after}


def _qcomms(doc: dict):
    """The export's reduced-precision communication as TorchRec's codecs (None: fp32)."""
    from torchrec.distributed.fbgemm_qcomm_codec import get_qcomm_codecs_registry
    from neuroshard.torchrec.export import qcomms_config
    config = qcomms_config(doc)
    return None if config is None else get_qcomm_codecs_registry(config, device=torch.device("cpu"))


def _run_in_torchrec(documents: list[dict]) -> list[list[dict]]:
    got = run_ranks(_worker, WORLD, (documents,), timeout=120)
    return [got[r] for r in range(WORLD)]


def _spec(tables) -> list[tuple[str, int, int]]:
    return [(t.name, t.num_embeddings, t.embedding_dim) for t in tables]


def _retyped(doc: dict, kind: str) -> dict:
    """One host's row split named as TorchRec's planner names it on a single host."""
    for record in doc["tables"].values():
        if record["sharding_type"] == "row_wise":
            record["sharding_type"] = kind
    return doc


def _searched_plans() -> list[Plan]:
    """Plans our searches write for 2 devices: memory forces row splits of the tables whose
    width cannot be halved, and hot tables get split along rows and columns, so the plans
    hold table-wise, column-wise, row-wise and grid tables."""
    from neuroshard.costmodels import analytic_cost_models
    from neuroshard.search import shard
    tables = TableSet("interop", [Table("a", 101, 16, 8.0, {"zipf_alpha": 1.1}), Table("b", 57, 8, 1.0),
                                  Table("c", 33, 16, 3.0), Table("g", 3001, 12, 20.0), Table("h", 1501, 32, 10.0)], 512)
    models = analytic_cost_models()
    plans = [shard(tables, devices=WORLD, memory="176KiB", algorithm=a, cost_models=models)
             for a in ("neuroshard", "size", "bayes")]
    plans += [shard(tables, devices=WORLD, memory="400KiB", algorithm="bayes", cost_models=models, seed=s)
              for s in range(3)]
    # hot tables a search splits along columns
    hot = TableSet("hot", [Table("t0", 2004, 64, 11.8, {"zipf_alpha": 0.87}), Table("t1", 2493, 16, 7.6),
                           Table("t2", 886, 64, 21.7, {"zipf_alpha": 1.16}), Table("t3", 2051, 16, 27.1),
                           Table("t4", 775, 8, 28.2, {"zipf_alpha": 1.19})], 512)
    plans.append(shard(hot, devices=WORLD, memory=641462, algorithm="neuroshard", cost_models=models, seed=146))
    return plans


def _torchrec_made() -> tuple[list, dict]:
    """A plan TorchRec's sharding helpers make for 2 ranks, through `plan import` and export."""
    from torchrec.distributed.sharding_plan import (column_wise, construct_module_sharding_plan, data_parallel,
                                                    grid_shard, row_wise, table_row_wise, table_wise)
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from neuroshard.torchrec.import_plan import plan_from_torchrec
    tables = [Table("tw", 50, 8, 1.0), Table("cw", 41, 16, 1.0), Table("rw", 77, 8, 1.0), Table("twrw", 65, 12, 1.0),
              Table("grid", 99, 256, 1.0), Table("dp", 30, 8, 1.0)]
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim,
                                                            num_embeddings=t.num_embeddings,
                                                            feature_names=[f"f_{t.name}"]) for t in tables],
                                 device=torch.device("meta"))
    made = construct_module_sharding_plan(
        ebc, {"tw": table_wise(rank=1), "cw": column_wise(ranks=[1, 0]), "rw": row_wise(),
              "twrw": table_row_wise(host_index=0), "grid": grid_shard(host_indexes=[0, 0]),
              "dp": data_parallel()},
        local_size=WORLD, world_size=WORLD, device_type="cpu")
    plan = plan_from_torchrec(made, TableSet("made", tables))
    assert plan.data_parallel_tables == ["dp"]
    return _spec(tables), _exported(plan)


def test_exported_plans_run_exactly_in_torchrec():
    """Table-, column-, row-wise, table-row-wise, grid and data-parallel plans, plans of our
    searches and a TorchRec-made plan: the same numbers as the unsharded model, to float
    tolerance."""
    spec = _spec(TABLES)
    cases = {kind: (spec, _exported(_plan(kind)))
             for kind in ("table_wise", "column_wise", "row_wise", "grid", "data_parallel")}
    cases["table_row_wise"] = (spec, _retyped(_exported(_plan("row_wise")), "table_row_wise"))
    seen = set()
    for i, plan in enumerate(_searched_plans()):
        doc = _exported(plan)
        seen |= {r["sharding_type"] for r in doc["tables"].values()}
        cases[f"searched #{i} ({plan.provenance['algorithm']})"] = (_spec(plan.tables), doc)
    assert seen >= {"table_wise", "column_wise", "row_wise", "grid_shard"}, seen
    cases["torchrec-made"] = _torchrec_made()
    per_rank = _run_in_torchrec(list(cases.values()))
    for r, results in enumerate(per_rank):
        for name, res in zip(cases, results):
            assert res["forward"] < 1e-5 and res["weights"] < 1e-5 and res["after_step"] < 1e-5, (name, r, res)


def test_floor_split_rows_are_refused_not_run_wrong():
    """The layout that ran silently wrong in TorchRec (500,000 + 500,001 rows) is refused."""
    plan = Plan([Table("big", 1_000_001, 8, 1.0)],
                [Shard("big", 0, 500_000, 0, 8, 0), Shard("big", 500_000, 500_001, 0, 8, 1)], 2, 10**9)
    with pytest.raises(NeuroShardError, match="table 'big'"):
        torchrec_sharding(plan, compute_device="cpu")
