"""Exported plans applied in real TorchRec: an EmbeddingBagCollection sharded by
DistributedModelParallel on 2 gloo processes (CPU, fused kernel) gives the same pooled
outputs, and after one SGD step the same weights, as the unsharded model built from
the same weights (the comparison: conftest's ``torchrec_interop``)."""
from __future__ import annotations

import pytest

torchrec = pytest.importorskip("torchrec")
pytest.importorskip("torchrec.distributed.planner")

import torch  # noqa: E402

from neuroshard.costmodels import analytic_cost_models  # noqa: E402
from neuroshard.errors import NeuroShardError  # noqa: E402
from neuroshard.plan import Plan, Shard  # noqa: E402
from neuroshard.search import search_plan  # noqa: E402
from neuroshard.tables import Table, TableSet  # noqa: E402
from neuroshard.torchrec.export import torchrec_sharding  # noqa: E402
from neuroshard.torchrec.import_plan import plan_from_torchrec  # noqa: E402

pytestmark = pytest.mark.torchrec
WORLD = 2  # torchrec_interop's ranks


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
    tables = TableSet("interop", [Table("a", 101, 16, 8.0, {"zipf_alpha": 1.1}), Table("b", 57, 8, 1.0),
                                  Table("c", 33, 16, 3.0), Table("g", 3001, 12, 20.0), Table("h", 1501, 32, 10.0)], 512)
    models = analytic_cost_models()
    plans = [search_plan(tables, devices=WORLD, memory="176KiB", algorithm=a, cost_models=models)
             for a in ("neuroshard", "size", "bayes")]
    plans += [search_plan(tables, devices=WORLD, memory="400KiB", algorithm="bayes", cost_models=models, seed=s)
              for s in range(3)]
    # hot tables a search splits along columns
    hot = TableSet("hot", [Table("t0", 2004, 64, 11.8, {"zipf_alpha": 0.87}), Table("t1", 2493, 16, 7.6),
                           Table("t2", 886, 64, 21.7, {"zipf_alpha": 1.16}), Table("t3", 2051, 16, 27.1),
                           Table("t4", 775, 8, 28.2, {"zipf_alpha": 1.19})], 512)
    plans.append(search_plan(hot, devices=WORLD, memory=641462, algorithm="neuroshard", cost_models=models, seed=146))
    return plans


def _torchrec_made(interop) -> tuple[list, dict]:
    """A plan TorchRec's sharding helpers make for 2 ranks, through `plan import` and export."""
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        grid_shard,
        row_wise,
        table_row_wise,
        table_wise,
    )
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

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
    return interop.spec(tables), interop.export(plan)


@pytest.mark.gloo
def test_exported_plans_run_exactly_in_torchrec(torchrec_interop):
    """Table-, column-, row-wise, table-row-wise, grid and data-parallel plans, plans of our
    searches and a TorchRec-made plan: the same numbers as the unsharded model, to float
    tolerance."""
    interop = torchrec_interop
    spec = interop.spec(interop.tables)
    cases = {kind: (spec, interop.export(interop.plan(kind)))
             for kind in ("table_wise", "column_wise", "row_wise", "grid", "data_parallel")}
    cases["table_row_wise"] = (spec, _retyped(interop.export(interop.plan("row_wise")), "table_row_wise"))
    seen = set()
    for i, plan in enumerate(_searched_plans()):
        doc = interop.export(plan)
        seen |= {r["sharding_type"] for r in doc["tables"].values()}
        cases[f"searched #{i} ({plan.provenance['algorithm']})"] = (interop.spec(plan.tables), doc)
    assert seen >= {"table_wise", "column_wise", "row_wise"}, seen
    cases["torchrec-made"] = _torchrec_made(interop)
    per_rank = interop.run(list(cases.values()))
    for r, results in enumerate(per_rank):
        for name, res in zip(cases, results):
            assert res["forward"] < 1e-5 and res["weights"] < 1e-5 and res["after_step"] < 1e-5, (name, r, res)


def test_floor_split_rows_are_refused_not_run_wrong():
    """The layout that ran silently wrong in TorchRec (500,000 + 500,001 rows) is refused."""
    plan = Plan([Table("big", 1_000_001, 8, 1.0)],
                [Shard("big", 0, 500_000, 0, 8, 0), Shard("big", 500_000, 500_001, 0, 8, 1)], 2, 10**9)
    with pytest.raises(NeuroShardError, match="table 'big'"):
        torchrec_sharding(plan, compute_device="cpu")
