"""TorchRec's own planner as a baseline (when ``torchrec`` is importable).

``EmbeddingShardingPlanner`` over a ``Topology`` of ``D`` devices with the given
memory (HBM of ``cuda`` devices by default; ``--param compute_device=cpu`` for DDR),
the per-rank batch (our tables' global batch / D, as TorchRec reads ``batch_size``),
table-wise, column-wise and row-wise allowed; its ``ShardingPlan`` is
turned into our pieces (``import_plan``, the converter ``plan import`` uses too)
and scored by our simulator like every other algorithm.
TorchRec counts more than the weights (optimizer state, buffers), so its plans are
conservative under our memory accounting.

TorchRec's planner runs every proposal of its four proposers and has no time limit of its
own by default (400 tables on 64 devices ran for more than 10 minutes). Here it gets one
(``timeout_s``, its ``timeout_seconds``; ``--param timeout_s=0``: none): at the limit it
stops proposing and keeps its best plan so far, which is said in one warning (no plan by
then: InfeasibleError). The limit counts proposals only: before them TorchRec enumerates
every sharding option (on 2 CPU cores, about two minutes for 400 tables on 64 devices).
While it plans, a progress line on a terminal (tqdm) or, with ``-v``, a log line every
``PROGRESS_LOG_S`` seconds says what it is doing.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import numpy as np

from ..constants import DATA_PARALLEL
from ..constraints import TableConstraints, plan_problems
from ..errors import InfeasibleError, NeuroShardError
from ..plan import Plan
from ..search.params import TorchRecParams
from ..search.registry import SearchFunction
from ..search.simulator import Simulator
from ..types import Piece, Placement
from ..units import format_bytes
from .guard import quiet_torchrec, require_torchrec
from .import_plan import shards_from_torchrec

log = logging.getLogger(__name__)

SHARDING_TYPES = ("table_wise", "column_wise", "row_wise")
#: TorchRec's optimizer class (``torchrec.optim``) of each of our optimizers
TORCHREC_OPTIMIZERS = {"sgd": "SGD", "adagrad": "Adagrad", "rowwise-adagrad": "RowWiseAdagrad", "adam": "Adam"}
#: seconds TorchRec's planner proposes at most when ``TorchRecParams`` names no ``timeout_s``
DEFAULT_TIMEOUT_S = 120.0
#: seconds between the progress log lines while TorchRec's planner runs (``-v``)
PROGRESS_LOG_S = 10.0


class _Progress:
    """What TorchRec's planner is doing, shown while it plans: a tqdm bar on a terminal
    (standard error), and a log line every ``PROGRESS_LOG_S`` seconds, from a thread, so a
    phase without callbacks (enumerating sharding options) shows too. Its proposers are
    wrapped (``_CountedProposer``) to count proposals and to see, as TorchRec does, when
    its time limit ends the search (it leaves a proposal without feedback)."""

    def __init__(self, tables: int, devices: int, timeout_s: float | None):
        self.tables, self.devices, self.timeout_s = tables, devices, timeout_s
        self.phase = "enumerating sharding options"
        self.proposals = 0
        self.timed_out = False  # set after planning: TorchRec left a proposal unanswered at its time limit
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchrec-planner-progress", daemon=True)
        self._bar: Any = None

    def line(self) -> str:
        limit = f" (it stops proposing after {self.timeout_s:g} s of proposals)" if self.timeout_s else ""
        return (f"TorchRec's planner: {self.tables} tables on {self.devices} devices, {self.phase}, "
                f"{self.proposals:,} proposals, {time.monotonic() - self.start:.0f} s{limit}")

    def __enter__(self) -> "_Progress":
        from tqdm import tqdm
        bar = tqdm(total=None, leave=False, disable=None, bar_format="{desc}")
        self._bar = None if bar.disable else bar
        log.info("%s", self.line())
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            self._bar.close()

    def _run(self) -> None:
        last_log = time.monotonic()
        while not self._stop.wait(1.0):
            if self._bar is not None:
                self._bar.set_description_str(self.line())
            if time.monotonic() - last_log >= PROGRESS_LOG_S:
                last_log = time.monotonic()
                log.info("%s", self.line())


class _CountedProposer:
    """One of TorchRec's proposers, counted by ``progress`` (the planner only calls
    ``load``, ``propose`` and ``feedback``)."""

    def __init__(self, proposer: Any, index: int, count: int, progress: _Progress):
        self._proposer, self._progress = proposer, progress
        self._name = f"proposer {index + 1} of {count} ({type(proposer).__name__})"
        self.pending = False  # a proposal TorchRec has not answered

    def load(self, *args: Any, **kwargs: Any) -> None:
        self._progress.phase = f"preparing {self._name}"
        self._proposer.load(*args, **kwargs)

    def propose(self) -> Any:
        self._progress.phase = self._name
        proposal = self._proposer.propose()
        if proposal:
            self._progress.proposals += 1
            self.pending = True  # TorchRec answers every proposal with feedback, unless its time is up
        return proposal

    def feedback(self, *args: Any, **kwargs: Any) -> None:
        self.pending = False
        self._proposer.feedback(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proposer, name)


def search(sim: Simulator, memory_bytes: int, compute_device: str = "cuda",
           timeout_s: float | None = DEFAULT_TIMEOUT_S) -> Placement:
    """TorchRec's plan for ``sim``'s tables, scored by the simulator; TorchRec's planner
    proposes for at most ``timeout_s`` seconds (None or 0: no limit), then keeps its best plan."""
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
        limit = int(math.ceil(timeout_s)) if timeout_s else None  # TorchRec's: whole seconds, positive
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=per_rank,
                                           constraints=constraints, debug=False,
                                           storage_reservation=FixedPercentageStorageReservation(0.0),
                                           timeout_seconds=limit)
        progress = _Progress(len(sim.tables), sim.num_devices, limit)
        counted: list[_CountedProposer] = []
        proposers = getattr(planner, "_proposers", None)  # TorchRec's defaults, counted
        if isinstance(proposers, list):
            counted = [_CountedProposer(p, i, len(proposers), progress) for i, p in enumerate(proposers)]
            planner._proposers = counted
        try:
            with progress:
                try:
                    plan = planner.plan(module, [EmbeddingBagCollectionSharder()])
                finally:
                    progress.timed_out = bool(limit) and any(p.pending for p in counted)
        except PlannerError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if progress.timed_out:
                raise InfeasibleError(f"TorchRec's planner found no plan in its time limit of {limit} s "
                                      f"({progress.proposals:,} proposals; --param timeout_s=N for more, 0 for "
                                      f"none): {first[:200]}") from None
            raise InfeasibleError(f"TorchRec's planner found no plan in {format_bytes(largest)} per device "
                                  f"(it also counts optimizer state and buffers, often 2-3x the weights): "
                                  f"{first[:200]}") from None
        except RuntimeError as exc:  # e.g. a table's constraints.sharding_types has no kernel on this device
            first = str(exc).strip().split(". ")[0]
            raise InfeasibleError(f"TorchRec's planner on {compute_device}: {first[:200]}") from None

    elapsed = time.monotonic() - progress.start
    if progress.timed_out:
        log.warning("TorchRec's planner gave up at its time limit of %d s (%s proposals, %.0f s in all): its best "
                    "plan so far is used (--param timeout_s=N to let it search longer, 0 for no limit)",
                    limit, f"{progress.proposals:,}", elapsed)
    else:
        log.info("TorchRec's planner: %s proposals in %.1f s", f"{progress.proposals:,}", elapsed)
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
                     {"parameters": {"compute_device": compute_device, "sharding_types": types,
                                     "timeout_s": limit or 0},
                      "simulated_cost_ms": cost,
                      "torchrec_planner": {"proposals": progress.proposals, "timed_out": progress.timed_out,
                                           "seconds": round(elapsed, 3)}})


def _search(sim: Simulator, memory_bytes: int, params: TorchRecParams | None, seed: int) -> Placement:
    """``search`` with the registry's arguments (TorchRec's planner is deterministic: no seed,
    but its time limit can cut it short)."""
    params = params or TorchRecParams()
    timeout_s = getattr(params, "timeout_s", DEFAULT_TIMEOUT_S)
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not 0 <= timeout_s < math.inf):
        raise NeuroShardError(f"parameter timeout_s must be seconds, 0 or more, got {timeout_s!r}"[:200])
    return search(sim, memory_bytes, params.compute_device, timeout_s)


ALGORITHM = SearchFunction("torchrec", TorchRecParams, _search)  # in the registry
