"""The simulator: a placement of shards -> predicted per-device cost, from the cost models.

``Simulator`` composes three parts, as TorchRec's planner splits a storage estimator, a
performance estimator and a topology:

* ``storage.Storage``: memory and placement rules, what fits where (memory tiers and the
  footprint, replicated tables, constraints, the tables split before any algorithm runs);
* ``performance.Performance``: what a placement costs, per device (the compute model on
  each device's set of pieces, the pieces' features and tiers' traffic, by piece id in
  ``pieces.PieceIndex``), with the all-to-all and the all-reduce of ``exchange_cost``;
* ``plan_conversion``: plans to pieces and back, the plan file's estimate.

The topology (hosts, links, per-device memory and speed) is resolved here once and given
to the parts. Search evaluates thousands of candidates, so the estimate takes many at once
and caches every piece and device set it costs; copies for other tiers or replicated
tables (``with_tiers``, ``with_data_parallel``) share those caches.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from ..constants import DEFAULT_ROW_BLOCKS, FP32_BYTES, block_counts, precision_of
from ..constraints import table_constraints
from ..costmodels.base import CostModels
from ..costmodels.precision import compute_scaling
from ..costmodels.tiers import TierCostModel
from ..errors import NeuroShardError
from ..optimizers import DEFAULT_OPTIMIZER, check_optimizer
from ..plan import Plan, Shard
from ..tables import TableSet
from ..tiers import Tier
from ..topology import Topology, ranks_per_host
from ..types import Estimate, Piece
from ..validate import check_comm_precision, check_row_blocks
from . import plan_conversion
from .exchange_cost import ExchangeCost, allreduce_ms, network_for
from .performance import Performance
from .storage import Storage, replicated_bytes

__all__ = ["Simulator", "allreduce_ms", "replicated_bytes"]


def _part(part: str, name: str, doc: str) -> property:
    """A read-only attribute of the simulator: ``name`` of its part ``part``."""
    return property(lambda self: getattr(getattr(self, part), name), doc=doc)


class Simulator:
    """Predicted costs of shard placements of ``tables`` on ``num_devices`` devices: the
    memory rules of ``storage`` and the costs of ``performance``, behind one object."""

    constraints = _part("storage", "constraints", "per table, by index (None: no table has any)")
    tiers = _part("storage", "tiers", "each table's memory tier (None: every table in device memory)")
    footprint = _part("storage", "footprint", "what a piece takes in device memory")
    tier_record = _part("storage", "tier_record", "how the tiers were chosen (``search.tiers``)")
    data_parallel_tables = _part("storage", "data_parallel_tables", "the tables replicated on every device")
    total_dim = _part("storage", "total_dim", "the columns of the tables that are not replicated")
    risk = _part("performance", "risk", "how much an ensemble's spread is charged (0: the mean)")
    tier_costs = _part("performance", "tier_costs", "the measured miss path the tiers are costed with")
    model_calls = _part("performance", "model_calls", "calls of the compute model so far")
    sets_predicted = _part("performance", "sets_predicted", "shard sets the compute model predicted so far")

    def __init__(self, tables: TableSet, num_devices: int, cost_models: CostModels, bytes_per_element: int = FP32_BYTES,
                 *, optimizer: str = DEFAULT_OPTIMIZER, data_parallel_tables: Sequence[str] = (),
                 risk: float | None = None, topology: Topology | None = None, comm_precision: str = "fp32",
                 tiers: Sequence[Tier] | None = None, row_blocks: str = DEFAULT_ROW_BLOCKS):
        self.tables = tables
        #: which row splits the search may make (``constants.ROW_BLOCKS``)
        self.row_blocks = check_row_blocks(row_blocks)
        self.num_devices = int(num_devices)
        self.cost_models = cost_models
        self.bytes_per_element = int(bytes_per_element)
        # compute at the weights' precision (``costmodels.precision``); comm at the exchange's element size
        self.compute_factor, self.cost_precision, self.precision_provenance = compute_scaling(
            cost_models, precision_of(self.bytes_per_element))
        self.comm_precision = check_comm_precision(comm_precision)
        self.optimizer = check_optimizer(optimizer)  # its state counts in every memory check
        constraints = table_constraints(tables)
        self.comm = cost_models.comm_for(self.num_devices)
        self._set_topology(topology)
        self.scale = cost_models.scale(tables.batch_size)
        self.storage = Storage(tables, self.num_devices, self.bytes_per_element, self.optimizer, topology=topology,
                               local_world_size=self.local_world_size, row_block_counts=self.row_block_counts,
                               constraints=constraints, tiers=tiers, data_parallel_tables=data_parallel_tables)
        exchange = ExchangeCost(self.comm, self.network, self.num_devices, cost_models, self.comm_precision, self.scale)
        self.performance = Performance(tables, self.num_devices, cost_models, self.storage, exchange, scale=self.scale,
                                       compute_factor=self.compute_factor, risk=risk, topology=topology)

    def _set_topology(self, topology: Topology | None) -> None:
        """Hosts, links, per-device memory and speed (None: identical devices, measured network)."""
        if topology is not None and topology.num_devices != self.num_devices:
            raise NeuroShardError(f"topology has {topology.num_devices} devices, the simulator {self.num_devices}")
        self.topology = topology
        #: what the exchange is costed over (``exchange_cost.network_for``; None: the measured network)
        self.network, self.comm_source = network_for(topology, self.num_devices, self.cost_models)
        self.hosts_stated = self.network is not None
        #: ranks per host of row splits kept on one host (TorchRec's default without hosts)
        self.local_world_size = ranks_per_host(self.network or topology, self.num_devices)
        #: the row block counts a search may cut a table into (``constants.block_counts``)
        self.row_block_counts = block_counts(self.num_devices, self.local_world_size, self.row_blocks)
        #: devices per host when the exchange is costed over hosts (the placers keep such row splits on one host)
        self.host_size = self.network.local_world_size if self.hosts_stated else None

    # ----------------------------------------------------------------- copies
    def with_tiers(self, tiers: Sequence[Tier] | None, record: dict | None = None) -> "Simulator":
        """A copy of this simulator with other tiers (set costs kept: the kernels are the same)."""
        other = copy.copy(self)
        other.storage = self.storage.with_tiers(tiers, record)
        other.performance = self.performance.with_tiers(other.storage)
        return other

    def with_tier_costs(self, measured: Any) -> "Simulator":
        """A copy of this simulator whose tiers are costed with ``measured`` (a
        ``TierMeasurement`` or its dict; None: the analytic model). The search times nothing:
        the caller measures (``costmodels.samples.tiers.measure_tier_costs``)."""
        other = self.with_tiers(self.tiers, self.tier_record)
        other.performance = other.performance.with_tier_costs(measured)
        return other

    def with_data_parallel(self, names: Sequence[str]) -> "Simulator":
        """This simulator with ``names`` replicated on every device (the caches of pieces and set
        costs shared, so trying a replication costs only the sets not seen before)."""
        other = copy.copy(self)
        other.storage = self.storage.with_data_parallel(names)
        other.performance = self.performance.with_data_parallel(other.storage)
        return other

    # ---------------------------------------------------- storage (what fits where)
    def memory_limits(self, memory_bytes: int) -> int | np.ndarray:
        """``memory_bytes``, or (D,) bytes per device when the topology gives per-device memory."""
        return self.storage.memory_limits(memory_bytes)

    def sharded_pieces(self) -> list[Piece]:
        """One piece per table that is not replicated (table-wise)."""
        return self.storage.sharded_pieces()

    def memory_split(self, memory_bytes: int, row_splits: bool = True) -> list[Piece]:
        """The tables as pieces, those larger than a device split (``Storage.memory_split``)."""
        return self.storage.memory_split(memory_bytes, row_splits)

    def sizes_bytes(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Device memory of pieces (``footprint``), as float64 for the placers."""
        return self.storage.sizes_bytes(pieces)

    def allowed(self, pieces: Sequence[Piece]) -> bool:
        """Whether every constrained table's pieces take a layout its constraints allow."""
        return self.storage.allowed(pieces)

    def device_mask(self, pieces: Sequence[Piece]) -> np.ndarray | None:
        """(pieces, devices): where each piece may go (pinned tables); None when none is pinned."""
        return self.storage.device_mask(pieces)

    def placement_rules(self, pieces: Sequence[Piece]) -> dict:
        """``greedy_place``'s constraint arguments for ``pieces`` (``Storage.placement_rules``)."""
        return self.storage.placement_rules(pieces)

    def allows_placement(self, pieces: Sequence[Piece], devices: np.ndarray) -> bool:
        """Whether a finished placement keeps every table's constraints."""
        return self.storage.allows_placement(pieces, devices)

    # ------------------------------------------------------ performance (costs)
    def tier_model(self) -> TierCostModel:
        """The tiers' cost model for these tables and topology (``Performance.tier_model``)."""
        return self.performance.tier_model()

    def replicated_ms(self) -> tuple[float, float]:
        """(compute at the local batch in the models' ms, all-reduce ms) every device pays for
        the replicated tables, computed once."""
        return self.performance.replicated_ms()

    def piece_ids(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Stable small integers for ``pieces`` (new pieces get their features computed once)."""
        return self.performance.piece_ids(pieces)

    def piece(self, pid: int) -> Piece:
        return self.performance.piece(pid)

    def features_of(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids), NUM_FEATURES) features of pieces by id."""
        return self.performance.features_of(ids)

    def cols_of(self, ids: np.ndarray) -> np.ndarray:
        """Columns (all-to-all width) of pieces by id."""
        return self.performance.cols_of(ids)

    def bytes_of(self, ids: np.ndarray) -> np.ndarray:
        """Memory of pieces by id (weights and optimizer state)."""
        return self.performance.bytes_of(ids)

    def set_costs_ms(self, sets: Sequence[tuple[int, ...]], risk: float | None = None) -> np.ndarray:
        """Compute cost (ms at the models' batch size) of each set of piece ids (sorted tuples)."""
        return self.performance.set_costs_ms(sets, risk)

    def single_costs_ms(self, pieces: Sequence[Piece] | np.ndarray) -> np.ndarray:
        """Predicted compute cost of each piece alone (pieces or their ids), at the tables' batch size."""
        return self.performance.single_costs_ms(pieces)

    def balanced_bound_ms(self) -> float:
        """The per-device cost of a perfectly balanced plan without communication."""
        return self.performance.balanced_bound_ms()

    def evaluate(self, pieces: Sequence[Piece], devices: np.ndarray, risk: float | None = None) -> Estimate:
        """Costs of ``P`` placements of the same pieces: ``devices`` is (P, len(pieces))."""
        return self.performance.evaluate(pieces, devices, risk)

    def evaluate_many(self, candidates: Sequence[tuple[Sequence[Piece], np.ndarray]]) -> Estimate:
        """Costs of candidate plans, each ``(pieces, device of each piece)``."""
        return self.performance.evaluate_many(candidates)

    def evaluate_ids(self, candidates: Sequence[tuple[np.ndarray, np.ndarray]], risk: float | None = None
                     ) -> Estimate:
        """Costs of candidate plans, each ``(piece ids, device of each piece)``."""
        return self.performance.evaluate_ids(candidates, risk)

    def evaluate_moves(self, ids: np.ndarray, devices: np.ndarray, moves: Sequence[Sequence[tuple[int, int]]],
                       chunk: int = 1024) -> np.ndarray:
        """Max ms of the plans that differ from ``(ids, devices)`` by ``moves`` (``Performance.evaluate_moves``)."""
        return self.performance.evaluate_moves(ids, devices, moves, chunk)

    def evaluate_with_compute(self, candidates: Sequence[tuple[Sequence[Piece], np.ndarray]],
                              compute_ms: np.ndarray) -> Estimate:
        """Estimates of placements whose per-device compute is given ((P, D) ms at the tables'
        batch size, e.g. measured): only communication is predicted."""
        return self.performance.evaluate_with_compute(candidates, compute_ms)

    # ------------------------------------------------------------------ plans
    def pieces_of_plan(self, plan: Plan) -> tuple[list[Piece], np.ndarray]:
        """A plan's shards as pieces of these tables, and their devices."""
        return plan_conversion.pieces_of_plan(self.tables, plan)

    def device_sets(self, plan: Plan) -> list[list[Piece]]:
        """The plan's pieces on each device (an empty list for an idle device)."""
        return plan_conversion.device_sets(self.tables, plan)

    def to_shards(self, pieces: Sequence[Piece], devices: np.ndarray) -> list[Shard]:
        """Pieces placed on devices as plan shards, ordered by table, rows, columns."""
        return plan_conversion.to_shards(self.tables, self.tiers, pieces, devices)

    def evaluate_plan(self, plan: Plan, compute_ms: Sequence[float] | None = None) -> Estimate:
        """Predicted costs of one plan (a batch of one). With ``compute_ms`` (per device, ms
        at the tables' batch size, e.g. measured), only communication is predicted. The plan's
        data-parallel tables are replicated, whatever this simulator replicates."""
        if tuple(plan.data_parallel_tables) != self.data_parallel_tables:
            return self.with_data_parallel(plan.data_parallel_tables).evaluate_plan(plan, compute_ms)
        pieces, devices = self.pieces_of_plan(plan)
        if compute_ms is None:
            return self.evaluate(pieces, devices[None, :], risk=0.0)
        return self.evaluate_with_compute([(pieces, devices)], np.asarray(compute_ms, dtype=np.float64)[None, :])

    def exchange_ms(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """(D,) forward and (D,) backward all-to-all ms of ``plan``'s exchange, without
        waiting for other devices (the iteration model, ``search.iteration``, adds the
        waiting on its own critical path), at the tables' batch size; with hosts, the
        row-wise reduce-scatter is part of the forward."""
        return self.performance.exchange_ms(*self.pieces_of_plan(plan))

    def plan_estimate(self, estimate: Estimate, index: int = 0) -> dict:
        """The plan file's ``estimate`` object of candidate ``index``: its costs, the batch size
        they are for, and the balanced bound with the plan's ratio to it (``make_plan``,
        ``score_plan`` and ``polish`` all write it this way)."""
        return plan_conversion.plan_estimate(estimate, index, self.tables.batch_size, self.balanced_bound_ms())

    @classmethod
    def from_plan(cls, plan: Plan, cost_models: CostModels, tables: TableSet | None = None,
                  batch_size: int | None = None) -> "Simulator":
        """The one simulator of a plan: its devices, weights and communication precision,
        optimizer, topology and row blocks (``provenance.row_blocks``), over ``tables``
        (default: the plan's own) at ``batch_size`` (default: the tables' batch; a measurement
        passes the batch it ran at)."""
        tables, settings = plan_conversion.simulator_settings(plan, tables, batch_size)
        return cls(tables, plan.num_devices, cost_models, **settings)
