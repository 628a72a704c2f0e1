"""TorchRec's own planner as a baseline (when ``torchrec`` is importable).

``EmbeddingShardingPlanner`` over a ``Topology`` of ``D`` devices with the given
memory (HBM of ``cuda`` devices by default; ``--param compute_device=cpu`` for DDR),
the per-rank batch (our tables' global batch / D, as TorchRec reads ``batch_size``),
table-wise, column-wise and row-wise allowed; its ``ShardingPlan`` is
turned into our pieces (``import_plan``, the converter ``plan import`` uses too)
and scored by our simulator like every other algorithm.
TorchRec counts more than the weights (optimizer state, buffers), so its plans are
conservative under our memory accounting.
"""
from __future__ import annotations

import numpy as np

from ..constants import DATA_PARALLEL
from ..constraints import TableConstraints, plan_problems
from ..errors import InfeasibleError
from ..plan import Plan
from ..search.params import TorchRecParams
from ..search.registry import SearchFunction
from ..search.simulator import Simulator
from ..types import Piece, Placement
from ..units import format_bytes
from .guard import quiet_torchrec, require_torchrec
from .import_plan import shards_from_torchrec

SHARDING_TYPES = ("table_wise", "column_wise", "row_wise")
#: TorchRec's optimizer class (``torchrec.optim``) of each of our optimizers
TORCHREC_OPTIMIZERS = {"sgd": "SGD", "adagrad": "Adagrad", "rowwise-adagrad": "RowWiseAdagrad", "adam": "Adam"}


def search(sim: Simulator, memory_bytes: int, compute_device: str = "cuda") -> Placement:
    """TorchRec's plan for ``sim``'s tables, scored by the simulator."""
    require_torchrec()
    import torch
    from torchrec import optim as trec_optim
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    data_type = {2: DataType.FP16, 1: DataType.INT8}.get(sim.bytes_per_element, DataType.FP32)
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                                  feature_names=[f"{t.name}__feature"], data_type=data_type) for t in sim.tables]
    # with hosts, TorchRec's table-row-wise too (row blocks on one host's ranks)
    types = list(SHARDING_TYPES) + (["table_row_wise"] if sim.host_size else [])
    rules = sim.constraints or [TableConstraints(t.name) for t in sim.tables]
    pinned = [r.name for r in rules if r.devices is not None]
    if pinned:
        raise InfeasibleError(f"table '{pinned[0]}' is pinned to devices (constraints.devices), which TorchRec's "
                              f"planner cannot express (its ParameterConstraints name no ranks); use another algorithm")
    # a table's constraints.sharding_types become TorchRec's (its data_parallel is the data-parallel search's)
    constraints = {t.name: ParameterConstraints(
        sharding_types=[k for k in types if rule.allows(k)] or sorted(rule.sharding_types - {DATA_PARALLEL}),
        pooling_factors=[max(t.pooling_factor, 1e-3)],
        # TorchRec cuts column-wise into strips of at least min_partition columns: ask for min_shards of them
        min_partition=max(4, t.embedding_dim // rule.min_shards) if rule.min_shards > 1 else None)
        for t, rule in zip(sim.tables, rules)}
    limits = np.broadcast_to(np.asarray(memory_bytes, dtype=np.int64), (sim.num_devices,))  # per device
    largest = int(limits.max())
    caps = {"hbm_cap": largest} if compute_device == "cuda" else {"ddr_cap": largest, "hbm_cap": 0}
    if sim.host_size:  # our topology's hosts and links (TorchRec's bandwidths are bytes per ms)
        caps.update(local_world_size=sim.host_size, intra_host_bw=sim.network.intra_host_gbps * 1e6,
                    inter_host_bw=sim.network.inter_host_gbps * 1e6)
    with quiet_torchrec():
        module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        # TorchRec's storage estimate counts the optimizer's state from the parameters' optimizer class
        apply_optimizer_in_backward(getattr(trec_optim, TORCHREC_OPTIMIZERS[sim.optimizer]), module.parameters(),
                                    {"lr": 0.01})
        topology = Topology(world_size=sim.num_devices, compute_device=compute_device, **caps)
        for device, limit in zip(topology.devices, limits.tolist()):  # heterogeneous memory
            if compute_device == "cuda":
                device.storage.hbm = limit
            else:
                device.storage.ddr = limit
        # TorchRec's batch_size is per rank; our tables' is the global batch (all ranks together)
        per_rank = max(1, sim.tables.batch_size // sim.num_devices)
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=per_rank,
                                           constraints=constraints, debug=False,
                                           storage_reservation=FixedPercentageStorageReservation(0.0))
        try:
            plan = planner.plan(module, [EmbeddingBagCollectionSharder()])
        except PlannerError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InfeasibleError(f"TorchRec's planner found no plan in {format_bytes(largest)} per device "
                                  f"(it also counts optimizer state and buffers, often 2-3x the weights): "
                                  f"{first[:200]}") from None
        except RuntimeError as exc:  # e.g. a table's constraints.sharding_types has no kernel on this device
            first = str(exc).strip().split(". ")[0]
            raise InfeasibleError(f"TorchRec's planner on {compute_device}: {first[:200]}") from None

    index = {t.name: i for i, t in enumerate(sim.tables)}
    shards, _ = shards_from_torchrec(plan, "TorchRec's plan")
    pieces = [Piece(index[s.table], s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in shards]
    devices = [s.device for s in shards]
    devices_arr = np.array(devices, dtype=np.int64)
    if not sim.allows_placement(pieces, devices_arr):  # TorchRec has no shard counts: min/max_shards checked here
        problems = plan_problems(Plan(list(sim.tables), shards, sim.num_devices, largest))
        raise InfeasibleError(f"TorchRec's planner's plan breaks the constraints: {'; '.join(problems[:2])}")
    cost = float(sim.evaluate(pieces, devices_arr[None, :]).max_ms[0])
    return Placement(pieces, devices_arr, cost,
                     {"parameters": {"compute_device": compute_device, "sharding_types": types},
                      "simulated_cost_ms": cost})


def _search(sim: Simulator, memory_bytes: int, params: TorchRecParams | None, seed: int) -> Placement:
    """``search`` with the registry's arguments (TorchRec's planner is deterministic: no seed)."""
    return search(sim, memory_bytes, (params or TorchRecParams()).compute_device)


ALGORITHM = SearchFunction("torchrec", TorchRecParams, _search)  # in the registry
