"""The simulator: a placement of shards -> predicted per-device cost, from the cost models.

Per device ``d`` of one candidate plan (all in ms at the tables' batch size)::

    compute_d = compute model on the set of shards on d (one fused kernel)
    bwd_d     = backward all-to-all of width_d (width_d = sum of the shards' columns)
    fwd_d     = forward all-to-all of width_d, waiting included: it starts when d is
                ready, skew_d = (compute_d + bwd_d) - max_e (compute_e + bwd_e)
    total_d   = compute_d + fwd_d + bwd_d;   cost of the plan = max_d total_d

Row-wise partial sums travel in the all-to-all (every row block's columns count in
``width_d``) and are added up by the receiver, so they are charged there, once;
``reduce_ms`` stays in the estimate (zero) for reductions outside the exchange.
Data-parallel tables (``data_parallel_tables``, see ``replicate``) are not pieces: every
device adds their compute at its local batch to ``compute_d`` and pays ``allreduce_d``,
the all-reduce of their gradients.

With a ``topology`` that states hosts (``neuroshard.topology``), no measured model covers
the network, so the exchange is bytes over bandwidth, in two parts per device: to and
from the ``L - 1`` peers on its host over ``intra_host_gbps``, and to and from the
``D - L`` peers on other hosts over ``inter_host_gbps`` (each part the larger of the
bytes sent and received; the parts add up; forward waiting as above). A column strip
whose ``k`` row blocks all lie on one host is table-row-wise (as TorchRec and ZionEX run
it): its partial sums are reduce-scattered within the host (``reduce_d``, ``(k-1)/k`` of
the strip's pooled output per block, over the intra-host links), and only the sums
cross hosts, each block sending ``1/k`` of the strip's columns. Without a topology, or
one without hosts, the measured models cost the exchange exactly as before. A device's
relative speed divides its compute.

Precision. ``compute_d`` is for the weights' precision (``bytes_per_element`` 2: fp16): a
compute model measured at another precision is scaled by the measured ratio of the two
(``costmodels.precision``). With ``comm_precision`` fp16 or bf16 the exchange moves half
the bytes: the measured comm models, fitted on fp32 exchanges, are given the widths that
move as many bytes in fp32 (half), and the topology's bytes use 2 bytes per element.

Search evaluates thousands of candidates, so the simulator takes many at once: one
compute-model call for every shard set not seen before (set costs are cached, keyed
by the sorted shard ids), and one call per communication term for the whole
``(candidates, devices)`` array.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from ..constants import (
    COMM_ELEMENT_BYTES,
    COMM_EXTRAPOLATION,
    DEFAULT_INTER_HOST_GBPS,
    DEFAULT_INTRA_HOST_GBPS,
    DEFAULT_ROW_BLOCKS,
    FP32_BYTES,
    block_counts,
    default_local_world_size,
)
from ..constraints import allowed_state, conform, device_mask, table_constraints
from ..costmodels.analytic import AnalyticCommModel
from ..costmodels.base import CostModels
from ..costmodels.features import FEATURE_NAMES, table_features
from ..costmodels.precision import compute_scaling
from ..costmodels.tiers import TierCostModel
from ..datasets.sampler import shard_table
from ..errors import NeuroShardError
from ..kernels import precision_of
from ..optimizers import DEFAULT_OPTIMIZER, check_optimizer, tables_bytes
from ..plan import Plan, Shard
from ..tables import TableSet
from ..tiers import IN_DEVICE_MEMORY, Tier, device_bytes_array
from ..topology import Topology, device_memory, ranks_per_host
from ..types import Estimate, Footprint, Piece, whole_pieces
from ..validate import check_comm_precision, check_row_blocks
from .rowwise import split_for_memory

_DIM = FEATURE_NAMES.index("dim")
_LOG_SIZE = FEATURE_NAMES.index("log2_size_bytes")
#: the compute model is called on at most this many sets at once
_PREDICT_CHUNK = 20000


class Simulator:
    """Predicted costs of shard placements of ``tables`` on ``num_devices`` devices.

    Pieces get small integer ids (``piece_ids``); their features, widths, sizes and
    single-piece costs are kept in arrays indexed by id, and set costs in a dict keyed
    by sorted id tuples, so a piece or a device's set is never costed twice."""

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
        self.constraints = table_constraints(tables)  # per table, by index (None: no table has any)
        self.comm = cost_models.comm_for(self.num_devices)
        self._set_topology(topology)
        self.scale = cost_models.scale(tables.batch_size)
        self._tier_model: TierCostModel | None = None  # shared by ``with_tiers`` copies: same tables and links
        #: a ``costmodels.measure.tiers.TierMeasurement`` to cost the tiers with (None: analytic)
        self.tier_costs: Any = None
        self._set_tiers(tiers)
        self._set_data_parallel(data_parallel_tables)
        self._piece_ids: dict[Piece, int] = {}
        self._pieces: list[Piece] = []
        self._features: list[np.ndarray] = []
        self._row_features: dict[tuple[int, int, int], np.ndarray] = {}
        self._arrays: dict[str, np.ndarray] = {}  # per-id arrays, rebuilt when pieces were added
        self._single_ms = np.zeros(0)              # single-piece cost per id (NaN: not yet predicted)
        self._set_costs: dict[tuple[int, ...], float] = {}
        # An ensemble's spread (std of its members' log ms) per set: the search charges
        # mean x exp(risk x spread), so it prefers a plan only beyond the models' disagreement.
        self._with_spread = getattr(cost_models.compute, "predict_with_spread", None)
        self.risk = (1.0 if self._with_spread else 0.0) if risk is None else float(risk)
        self._set_spread: dict[tuple[int, ...], float] = {}
        # pieces of equal features are one to the model (``set_costs_ms``)
        self._class_of: dict[bytes, int] = {}     # a piece's features -> their number
        self._class_rows: list[np.ndarray] = []   # the features of each number
        self._classes = np.zeros(0, dtype=np.int64)  # per piece id, its number
        self._class_costs: dict[tuple[int, ...], tuple[float, float]] = {}  # sorted numbers -> (ms, spread)
        self.model_calls = 0
        self.sets_predicted = 0

    # ------------------------------------------------------------ topology
    def _set_topology(self, topology: Topology | None) -> None:
        """Hosts, links, per-device memory and speed (None: identical devices, measured network)."""
        if topology is not None and topology.num_devices != self.num_devices:
            raise NeuroShardError(f"topology has {topology.num_devices} devices, the simulator {self.num_devices}")
        self.topology = topology
        #: what the exchange is costed over: the stated hosts and links; else the measured
        #: network (None) within ``COMM_EXTRAPOLATION`` x the device counts the comm models
        #: were measured on, and beyond that the GPU-cluster defaults (hosts of 8, TorchRec's
        #: bandwidths): a model fitted on 2-4 processes says nothing about 1,024
        self.network, self.comm_source = _network(topology, self.num_devices, self.cost_models)
        self.hosts_stated = self.network is not None
        #: ranks per host of row splits kept on one host (TorchRec's default without hosts)
        self.local_world_size = ranks_per_host(self.network or topology, self.num_devices)
        #: the row block counts a search may cut a table into (``constants.block_counts``)
        self.row_block_counts = block_counts(self.num_devices, self.local_world_size, self.row_blocks)
        #: devices per host when the exchange is costed over hosts (the placers keep such row splits on one host)
        self.host_size = self.network.local_world_size if self.hosts_stated else None
        self._speed = None if topology is None or topology.relative_speed is None else topology.speeds()

    def _set_tiers(self, tiers: Sequence[Tier] | None) -> None:
        """Each table's memory tier (``neuroshard.tiers``; None: every table in device memory):
        what its pieces take in device memory (``footprint``) and what the tier's traffic adds
        to their device's compute (``costmodels.tiers``, analytic)."""
        if tiers is not None and len(tiers) != len(self.tables):
            raise NeuroShardError(f"{len(tiers)} tiers given for {len(self.tables)} tables")
        self.tiers = None if tiers is None or all(t.on_device for t in tiers) else tuple(tiers)
        self.footprint = Footprint(self.bytes_per_element, self.optimizer, self.tiers)
        self.tier_record: dict = {}  # how the tiers were chosen (``search.tiers``), for the provenance

    def tier_model(self) -> TierCostModel:
        """The tiers' cost model for these tables and topology (its miss-rate curves kept),
        with the measured miss path of ``tier_costs`` when set."""
        if self._tier_model is None:
            self._tier_model = TierCostModel(self.topology, self.num_devices, self.tables.batch_size,
                                             self.bytes_per_element, self.optimizer, measured=self.tier_costs)
        return self._tier_model

    def with_tier_costs(self, measured: Any) -> "Simulator":
        """A copy of this simulator whose tiers are costed with ``measured`` (a
        ``TierMeasurement`` or its dict; None: the analytic model). The search times nothing:
        the caller measures (``costmodels.measure.tiers.measure_tier_costs``)."""
        other = self.with_tiers(self.tiers, self.tier_record)
        other.tier_costs = measured
        other._tier_model = None
        return other

    def with_tiers(self, tiers: Sequence[Tier] | None, record: dict | None = None) -> "Simulator":
        """A copy of this simulator with other tiers (set costs kept: the kernels are the same)."""
        other = copy.copy(self)
        other._set_tiers(tiers)
        other.tier_record = dict(record or {})
        other._arrays = {}
        other._single_ms = np.full(len(self._pieces), np.nan)
        other._memory_splits = {}
        return other

    def memory_limits(self, memory_bytes: int) -> int | np.ndarray:
        """What the placers compare with: ``memory_bytes``, or (D,) bytes per device when the
        topology gives per-device memory."""
        return device_memory(self.topology, memory_bytes)

    # ------------------------------------------------- data-parallel tables
    def _set_data_parallel(self, names: Sequence[str]) -> None:
        """Replicate the tables ``names`` on every device: they leave the pieces (``sharded_pieces``)
        and the all-to-all, and every device pays their cost (``replicated_costs_ms``)."""
        unknown = sorted(set(names) - {t.name for t in self.tables})
        if unknown:
            raise NeuroShardError(f"data-parallel table '{unknown[0]}' is not among the tables")
        self.data_parallel_tables = tuple(t.name for t in self.tables if t.name in set(names))
        self.total_dim = sum(t.embedding_dim for t in self.tables if t.name not in self.data_parallel_tables)
        self._replicated_ms: tuple[float, float] | None = None
        self._memory_splits: dict[tuple[int, bool], list[Piece]] = {}

    def with_data_parallel(self, names: Sequence[str]) -> "Simulator":
        """This simulator with ``names`` replicated on every device (the caches of pieces and set
        costs shared, so trying a replication costs only the sets not seen before)."""
        other = copy.copy(self)
        other._set_data_parallel(names)
        return other

    def sharded_pieces(self) -> list[Piece]:
        """One piece per table that is not replicated (table-wise)."""
        return [p for p in whole_pieces(self.tables) if self.tables[p.table].name not in self.data_parallel_tables]

    def replicated_ms(self) -> tuple[float, float]:
        """(compute at the local batch in the models' ms, all-reduce ms) every device pays for
        the replicated tables (``replicated_costs_ms``), computed once."""
        if self._replicated_ms is None:
            self._replicated_ms = replicated_costs_ms(self)
        return self._replicated_ms

    # ------------------------------------------------------------- pieces
    def memory_split(self, memory_bytes: int, row_splits: bool = True) -> list[Piece]:
        """The tables as pieces, those larger than a device split (``rowwise.split_for_memory``,
        as many row blocks as TorchRec runs): computed once per memory and ``row_splits``
        (``shard()`` does it before any algorithm runs), a new list each call."""
        key = (int(np.max(memory_bytes)), bool(row_splits))  # per-device memory: split for the largest device
        if key not in self._memory_splits:
            self._memory_splits[key] = split_for_memory(self.sharded_pieces(), key[0], self.footprint, row_splits,
                                                        self.num_devices, counts=self.row_block_counts)
            if self.constraints is not None:
                self._memory_splits[key] = self._conform(self._memory_splits[key], memory_bytes, row_splits)
        return list(self._memory_splits[key])

    # -------------------------------------------------------- constraints
    def _conform(self, pieces: list[Piece], memory_bytes: int, row_splits: bool) -> list[Piece]:
        """Each constrained table's pieces in an allowed layout that fits its (pinned) devices
        (``constraints.conform``)."""
        limits = memory_bytes if np.ndim(memory_bytes) else self.memory_limits(memory_bytes)
        limits = np.broadcast_to(np.asarray(limits, dtype=np.float64), (self.num_devices,))
        out: list[Piece] = []
        for t in sorted({p.table for p in pieces}):
            mine, rule = [p for p in pieces if p.table == t], self.constraints[t]
            if rule.any:
                pinned = list(rule.devices) if rule.devices is not None else slice(None)
                mine = conform(mine, self.tables[t], rule, float(limits[pinned].max()),
                               lambda cols, t=t: self.footprint.row_bytes(Piece(t, 0, 1, 0, cols)),
                               self.num_devices, self.local_world_size, row_splits)
            out += mine
        return sorted(out)

    def allowed(self, pieces: Sequence[Piece]) -> bool:
        """Whether every constrained table's pieces take a layout its constraints allow."""
        return allowed_state(pieces, self.constraints, self.num_devices, self.local_world_size)

    def device_mask(self, pieces: Sequence[Piece]) -> np.ndarray | None:
        """(pieces, devices): where each piece may go (pinned tables); None when none is pinned."""
        return device_mask(pieces, self.constraints, self.num_devices)

    def placement_rules(self, pieces: Sequence[Piece]) -> dict:
        """``greedy_place``'s constraint arguments for ``pieces``: where each may go (``allowed``)
        and which to place first (``first``: pieces of constrained tables); empty without constraints."""
        if self.constraints is None:
            return {}
        return {"allowed": self.device_mask(pieces),
                "first": np.array([self.constraints[p.table].any for p in pieces], dtype=bool)}

    def allows_placement(self, pieces: Sequence[Piece], devices: np.ndarray) -> bool:
        """Whether a finished placement keeps every table's constraints (layout, shard counts,
        pinned devices)."""
        if self.constraints is None:
            return True
        mask = self.device_mask(pieces)
        return (allowed_state(pieces, self.constraints, self.num_devices, self.local_world_size, final=True)
                and (mask is None or bool(mask[np.arange(len(pieces)), np.asarray(devices)].all())))

    def piece_ids(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Stable small integers for ``pieces`` (new pieces get their features computed once)."""
        ids = self._piece_ids
        for piece in pieces:
            if piece not in ids:
                ids[piece] = len(self._pieces)
                self._pieces.append(piece)
                self._features.append(self._piece_features(piece))
        return np.array([ids[p] for p in pieces], dtype=np.int64)

    def piece(self, pid: int) -> Piece:
        return self._pieces[pid]

    def _piece_features(self, piece: Piece) -> np.ndarray:
        """Features of a piece. Rows decide lookups and reuse (``sampler.shard_table``, cached per
        row range); a column range only changes the width and the size."""
        table = self.tables[piece.table]
        key = (piece.table, piece.row_offset, piece.num_rows)
        base = self._row_features.get(key)
        if base is None:
            part = shard_table(table, piece.row_offset, piece.num_rows, 0, table.embedding_dim,
                               self.cost_models.batch_size)
            base = table_features(part, self.cost_models.batch_size)
            self._row_features[key] = base
        features = base.copy()
        features[_DIM] = piece.num_cols
        features[_LOG_SIZE] = np.log2(piece.num_rows * piece.num_cols * FP32_BYTES)
        return features

    def _array(self, name: str) -> np.ndarray:
        if len(self._arrays.get("cols", ())) != len(self._pieces):
            pieces = np.array(self._pieces, dtype=np.int64).reshape(-1, 5)
            # what each piece's tier adds to its device (ms at the models' batch; 0 in device memory)
            tier_ms = np.zeros(len(self._pieces)) if self.tiers is None else np.array(
                [self.tier_model().shard_ms(self.tables[p.table], self.tiers[p.table], p.num_rows, p.num_cols)
                 for p in self._pieces]) / self.scale
            self._arrays = {"tier_ms": tier_ms,
                            "features": np.stack(self._features) if self._features else
                            np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32),
                            "cols": pieces[:, 4].astype(np.float64),
                            # a number per column strip (table, first column, width): row blocks share it
                            "strip": np.unique(pieces[:, [0, 3, 4]], axis=0, return_inverse=True)[1].reshape(-1),
                            "bytes": device_bytes_array(self.tiers, pieces[:, 0], pieces[:, 2], pieces[:, 4],
                                                        self.bytes_per_element, self.optimizer)}
            grown = np.full(len(self._pieces), np.nan)
            grown[:len(self._single_ms)] = self._single_ms
            self._single_ms = grown
        return self._arrays[name]

    def features_of(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids), NUM_FEATURES) features of pieces by id."""
        return self._array("features")[ids]

    def cols_of(self, ids: np.ndarray) -> np.ndarray:
        """Columns (all-to-all width) of pieces by id."""
        return self._array("cols")[ids]

    def bytes_of(self, ids: np.ndarray) -> np.ndarray:
        """Memory of pieces by id (weights and optimizer state)."""
        return self._array("bytes")[ids]

    def sizes_bytes(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Device memory of pieces (``footprint``), as float64 for the placers."""
        return self.footprint.sizes(pieces)
    # -------------------------------------------------------------- costs
    def set_costs_ms(self, sets: Sequence[tuple[int, ...]], risk: float | None = None) -> np.ndarray:
        """Compute cost (ms at the models' batch size) of each set of piece ids (sorted
        tuples); the model is called once for all sets not seen before. With an ensemble,
        ``mean x exp(risk x spread)`` (``risk`` defaults to the simulator's; 0: the mean).

        Sets of pieces with the same features (a table's two equal column halves) are one
        set to the model: predicted once, their rows in one canonical order, so they cost
        exactly the same. Predicted apart, in different batches of the model, they differed
        in the last bits, and which of two equal pieces the search split or placed first
        depended on the CPU's float rounding (the same tables planned differently on an
        AMD EPYC and an Intel Xeon, session 17)."""
        known = self._set_costs
        missing = list({s for s in sets if s and s not in known})
        if missing:
            classes = self._feature_classes()
            keys = [tuple(sorted(classes[list(s)].tolist())) for s in missing]
            by_key = self._class_costs
            todo = list(dict.fromkeys(k for k in keys if k not in by_key))
            for start in range(0, len(todo), _PREDICT_CHUNK):
                chunk = todo[start:start + _PREDICT_CHUNK]
                features = [np.stack([self._class_rows[c] for c in key]) for key in chunk]
                spread = None
                if self._with_spread:
                    costs, spread = self._with_spread(features)
                    spread = np.asarray(spread, dtype=np.float64).tolist()
                else:
                    costs = self.cost_models.compute.predict(features)
                costs = (np.asarray(costs, dtype=np.float64) * self.compute_factor).tolist()
                by_key.update(zip(chunk, zip(costs, spread or [0.0] * len(chunk))))
                self.model_calls += 1
                self.sets_predicted += len(chunk)
            for s, key in zip(missing, keys):
                known[s], spread = by_key[key]
                if self._with_spread:  # only an ensemble has a spread to charge
                    self._set_spread[s] = spread
        costs = np.array([known[s] if s else 0.0 for s in sets], dtype=np.float64)
        risk = self.risk if risk is None else risk
        if risk and self._with_spread:
            costs *= np.exp(risk * np.array([self._set_spread.get(s, 0.0) for s in sets]))
        return costs

    def _feature_classes(self) -> np.ndarray:
        """Per piece id, the number of its features (pieces of equal features share it)."""
        done = len(self._classes)
        if done < len(self._features):
            index = self._class_of
            new = []
            for row in self._features[done:]:
                number = index.setdefault(row.tobytes(), len(index))
                if number == len(self._class_rows):
                    self._class_rows.append(row)
                new.append(number)
            self._classes = np.concatenate([self._classes, np.array(new, dtype=np.int64)])
        return self._classes

    def single_costs_ms(self, pieces: Sequence[Piece] | np.ndarray) -> np.ndarray:
        """Predicted compute cost of each piece alone (pieces or their ids), at the tables'
        batch size."""
        ids = pieces if isinstance(pieces, np.ndarray) else self.piece_ids(pieces)
        self._array("cols")  # grow the per-id arrays
        todo = np.unique(ids[np.isnan(self._single_ms[ids])])
        if len(todo):
            self._single_ms[todo] = self.set_costs_ms([(int(i),) for i in todo]) + self._array("tier_ms")[todo]
        return self._single_ms[ids] * self.scale

    def evaluate(self, pieces: Sequence[Piece], devices: np.ndarray, risk: float | None = None) -> Estimate:
        """Costs of ``P`` placements of the same pieces: ``devices`` is (P, len(pieces))."""
        ids = self.piece_ids(pieces)
        return self.evaluate_ids([(ids, row) for row in np.atleast_2d(devices)], risk)

    def evaluate_many(self, candidates: Sequence[tuple[Sequence[Piece], np.ndarray]]) -> Estimate:
        """Costs of candidate plans, each ``(pieces, device of each piece)``."""
        return self.evaluate_ids([(self.piece_ids(pieces), devices) for pieces, devices in candidates])

    def evaluate_ids(self, candidates: Sequence[tuple[np.ndarray, np.ndarray]], risk: float | None = None
                     ) -> Estimate:
        """Costs of candidate plans, each ``(piece ids, device of each piece)``: one
        compute-model call for the unseen device sets of all candidates, one call per
        communication term for the whole (candidates, devices) array."""
        num, dev = len(candidates), self.num_devices
        widths = np.zeros((num, dev))
        reduce_bytes = np.zeros((num, dev)) if self.hosts_stated else None
        set_keys: list[tuple[int, ...]] = []
        tiered = np.zeros((num, dev)) if self.tiers is not None else None
        for p, (ids, devices) in enumerate(candidates):
            devices = np.asarray(devices, dtype=np.int64)
            if tiered is not None:
                tiered[p] = self._tier_load(ids, devices)
            widths[p], reduced = self._exchange_widths(ids, devices)
            if reduced is not None:
                reduce_bytes[p] = reduced
            order = np.lexsort((ids, devices))
            bounds = np.searchsorted(devices[order], np.arange(dev + 1)).tolist()
            sorted_ids = ids[order].tolist()
            set_keys.extend(tuple(sorted_ids[bounds[d]:bounds[d + 1]]) for d in range(dev))
        compute = self._device_compute(self.set_costs_ms(set_keys, risk).reshape(num, dev), tiered)
        return self._with_comm(compute, widths, reduce_bytes)

    def _tier_load(self, ids: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """(D,) ms the tiers of pieces ``ids`` on ``devices`` add to each device (models' batch)."""
        return np.bincount(np.asarray(devices, dtype=np.int64), weights=self._array("tier_ms")[ids],
                           minlength=self.num_devices)

    def _device_compute(self, compute: np.ndarray, tiered: np.ndarray | None) -> np.ndarray:
        """(P, D) set costs (ms at the models' batch) with what every device adds: its tiers'
        traffic (modelled), the replicated tables' lookups; divided by its relative speed."""
        if tiered is not None:  # the tiers' traffic (misses over the host link, SSD reads), modelled
            compute = compute + tiered
        if self.data_parallel_tables:  # every device looks up the replicated tables for its slice
            compute = compute + self.replicated_ms()[0]
        if self._speed is not None:  # a device twice as fast computes in half the time
            compute = compute / self._speed
        return compute

    def evaluate_moves(self, ids: np.ndarray, devices: np.ndarray, moves: Sequence[Sequence[tuple[int, int]]],
                       chunk: int = 1024) -> np.ndarray:
        """Max ms of the plans that differ from ``(ids, devices)`` by ``moves`` (each a few
        ``(position, new device)`` pairs), the same figures ``evaluate_ids`` gives for them:
        only the devices a move changes are costed again (their sets), the all-to-all is
        re-derived from widths changed by the moved columns (the whole exchange again only
        when a moved piece is a row block, whose host decides table-row-wise), and
        candidates go through the communication terms ``chunk`` at a time. What a local
        search over thousands of devices needs: its candidates change two devices each."""
        devices = np.asarray(devices, dtype=np.int64)
        dev = self.num_devices
        order = np.argsort(devices, kind="stable")
        bounds = np.searchsorted(devices[order], np.arange(dev + 1))
        members = [order[bounds[d]:bounds[d + 1]].tolist() for d in range(dev)]
        id_list = ids.tolist()
        base_keys = [tuple(sorted(id_list[i] for i in m)) for m in members]
        base_sets = self.set_costs_ms(base_keys)
        cols = self.cols_of(ids)
        tier_ms = None if self.tiers is None else self._array("tier_ms")[ids]
        base_tier = None if tier_ms is None else self._tier_load(ids, devices)
        base_widths, base_reduce = self._exchange_widths(ids, devices)
        blocks = None
        if self.hosts_stated:  # row blocks: moving one may change its strip's table-row-wise layout
            _, inverse, counts = np.unique(self._array("strip")[ids], return_inverse=True, return_counts=True)
            blocks = counts[inverse.reshape(-1)] > 1
        out = np.empty(len(moves))
        for start in range(0, len(moves), chunk):
            part = moves[start:start + chunk]
            num = len(part)
            sets = np.repeat(base_sets[None, :], num, axis=0)
            widths = np.repeat(base_widths[None, :], num, axis=0)
            reduce = None if base_reduce is None else np.repeat(base_reduce[None, :], num, axis=0)
            tiered = None if base_tier is None else np.repeat(base_tier[None, :], num, axis=0)
            keys: list[tuple[int, ...]] = []
            where: list[tuple[int, int]] = []
            for p, move in enumerate(part):
                changed: dict[int, set[int]] = {}
                for i, new in move:
                    old = int(devices[i])
                    changed.setdefault(old, set(members[old])).discard(i)
                    changed.setdefault(new, set(members[new])).add(i)
                    if tiered is not None:
                        tiered[p, old] -= tier_ms[i]
                        tiered[p, new] += tier_ms[i]
                for d, mine in changed.items():
                    keys.append(tuple(sorted(id_list[i] for i in mine)))
                    where.append((p, d))
                if blocks is not None and any(blocks[i] for i, _ in move):
                    moved = devices.copy()
                    for i, new in move:
                        moved[i] = new
                    widths[p], reduce[p] = self._exchange_widths(ids, moved)
                else:
                    for i, new in move:
                        widths[p, devices[i]] -= cols[i]
                        widths[p, new] += cols[i]
            if where:
                at = np.array(where, dtype=np.int64)
                sets[at[:, 0], at[:, 1]] = self.set_costs_ms(keys)
            out[start:start + num] = self._with_comm(self._device_compute(sets, tiered), widths, reduce).max_ms
        return out

    def _with_comm(self, compute: np.ndarray, widths: np.ndarray, reduce_bytes: np.ndarray | None = None
                   ) -> Estimate:
        """The estimate of plans whose per-device compute is ``compute`` (P, D), in ms at
        the models' batch size: the communication terms added (forward waiting included)."""
        num, dev = compute.shape
        intra = inter = None
        if self.hosts_stated:
            intra, inter = self._exchange_ms(widths)
            bwd = intra + inter
            reduce = reduce_bytes / self._bytes_per_ms(self.network.intra_host_gbps)
            ready = compute + bwd + reduce
            fwd = bwd + (ready.max(axis=1, keepdims=True) - ready)
            intra, inter = 2 * intra * self.scale, 2 * inter * self.scale
        else:  # the comm models were measured on fp32 exchanges: fewer bytes per column = fewer columns
            sent = widths * (self._comm_element_bytes() / 4)
            bwd = self.comm.predict_backward(sent)
            ready = compute + bwd
            fwd = self.comm.predict_forward(sent, ready - ready.max(axis=1, keepdims=True))
            reduce = np.zeros((num, dev))  # row-wise partial sums are in ``widths`` (module docstring)
        # the all-reduce of replicated tables' gradients does not grow with the batch: not scaled
        allreduce = np.full((num, dev), self.replicated_ms()[1]) if self.data_parallel_tables else None
        return Estimate(compute * self.scale, fwd * self.scale, bwd * self.scale, reduce * self.scale, allreduce,
                        intra, inter)

    def exchange_ms(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """(D,) forward and (D,) backward all-to-all ms of ``plan``'s exchange, without
        waiting for other devices (the iteration model, ``search.iteration``, adds the
        waiting on its own critical path), at the tables' batch size; with hosts, the
        row-wise reduce-scatter is part of the forward."""
        pieces, devices = self.pieces_of_plan(plan)
        widths, reduce_bytes = self._exchange_widths(self.piece_ids(pieces), devices)
        if self.hosts_stated:
            intra, inter = self._exchange_ms(widths[None, :])
            bwd = (intra + inter)[0]
            fwd = bwd + reduce_bytes / self._bytes_per_ms(self.network.intra_host_gbps)
        else:
            sent = widths[None, :] * (self._comm_element_bytes() / 4)
            bwd = self.comm.predict_backward(sent)[0]
            fwd = self.comm.predict_forward(sent, np.zeros_like(sent))[0]
        return fwd * self.scale, bwd * self.scale

    # ------------------------------------------------- exchange over hosts
    def _comm_element_bytes(self) -> int:
        return COMM_ELEMENT_BYTES[self.comm_precision]

    @staticmethod
    def _bytes_per_ms(gbps: float) -> float:
        return gbps * 1e6  # GB/s = 10**9 bytes per second

    def _exchange_widths(self, ids: np.ndarray, devices: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(D,) columns each device sends in the all-to-all and, when the topology states
        hosts, (D,) bytes it reduce-scatters within its host, at the models' batch size (else
        None). With hosts, a strip whose ``k > 1`` row blocks lie on one host is
        table-row-wise: each block sends ``cols / k`` and reduce-scatters ``(k - 1) / k`` of
        the strip's partial sums; every other piece sends its columns."""
        cols = self.cols_of(ids)
        if not self.hosts_stated:
            return np.bincount(devices, weights=cols, minlength=self.num_devices), None
        strips, inverse, blocks = np.unique(self._array("strip")[ids], return_inverse=True, return_counts=True)
        hosts = self.network.host_of()[devices]
        low = np.full(len(strips), np.iinfo(np.int64).max)
        high = np.full(len(strips), -1)
        np.minimum.at(low, inverse, hosts)
        np.maximum.at(high, inverse, hosts)
        k = blocks[inverse].astype(np.float64)
        one_host = ((blocks > 1) & (low == high))[inverse]
        sent = np.where(one_host, cols / k, cols)
        reduced = np.where(one_host, self.cost_models.batch_size * cols * (k - 1) / k, 0.0) * self._comm_element_bytes()
        return (np.bincount(devices, weights=sent, minlength=self.num_devices),
                np.bincount(devices, weights=reduced, minlength=self.num_devices))

    def _exchange_ms(self, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, D) intra- and inter-host ms of one all-to-all (one direction) of ``widths``
        columns per device, at the models' batch size: each device sends ``B / D`` samples'
        columns to every peer and receives the peers' columns for its ``B / D`` samples."""
        topo, dev = self.network, self.num_devices
        share = self.cost_models.batch_size / dev * self._comm_element_bytes()  # bytes per column and peer
        host = topo.host_of()
        on_host = np.stack([widths[:, host == h].sum(axis=1) for h in range(topo.num_hosts)], axis=1)[:, host]
        local = topo.local_world_size
        intra_bytes = np.maximum(widths * (local - 1), on_host - widths) * share
        inter_bytes = np.maximum(widths * (dev - local), widths.sum(axis=1, keepdims=True) - on_host) * share
        return (intra_bytes / self._bytes_per_ms(topo.intra_host_gbps),
                inter_bytes / self._bytes_per_ms(topo.inter_host_gbps))

    # -------------------------------------------------------------- plans
    def pieces_of_plan(self, plan: Plan) -> tuple[list[Piece], np.ndarray]:
        """A plan's shards as pieces of these tables, and their devices."""
        index = {t.name: i for i, t in enumerate(self.tables)}
        pieces = [Piece(index[s.table], s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in plan.shards]
        return pieces, np.array([s.device for s in plan.shards], dtype=np.int64)

    def device_sets(self, plan: Plan) -> list[list[Piece]]:
        """The plan's pieces on each device (an empty list for an idle device)."""
        pieces, where = self.pieces_of_plan(plan)
        return [[p for p, d in zip(pieces, where) if d == device] for device in range(plan.num_devices)]

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

    def evaluate_with_compute(self, candidates: Sequence[tuple[Sequence[Piece], np.ndarray]],
                              compute_ms: np.ndarray) -> Estimate:
        """Estimates of ``P`` placements whose per-device compute is given ((P, D) ms at the
        tables' batch size, e.g. measured): only communication is predicted."""
        placed = [(self.piece_ids(pieces), np.asarray(devices)) for pieces, devices in candidates]
        exchanges = [self._exchange_widths(ids, devices) for ids, devices in placed]
        widths = np.stack([w for w, _ in exchanges])
        reduce_bytes = None if exchanges[0][1] is None else np.stack([r for _, r in exchanges])
        compute = np.asarray(compute_ms, dtype=np.float64) / self.scale
        if self.tiers is not None:  # a measured kernel does not include the tiers' traffic: modelled
            compute = compute + np.stack([self._tier_load(ids, devices) for ids, devices in placed])
        return self._with_comm(compute, widths, reduce_bytes)

    def to_shards(self, pieces: Sequence[Piece], devices: np.ndarray) -> list[Shard]:
        """Pieces placed on devices as plan shards, ordered by table, rows, columns."""
        names = [t.name for t in self.tables]
        placed = sorted(zip(pieces, np.asarray(devices).tolist()))
        tiers = self.tiers or [IN_DEVICE_MEMORY] * len(names)
        return [Shard(names[p.table], p.row_offset, p.num_rows, p.col_offset, p.num_cols, int(d), tiers[p.table])
                for p, d in placed]

    def plan_estimate(self, estimate: Estimate, index: int = 0) -> dict:
        """The plan file's ``estimate`` object of candidate ``index``: its costs, the batch size
        they are for, and the balanced bound with the plan's ratio to it (``make_plan``,
        ``score_plan`` and ``polish`` all write it this way)."""
        record = estimate.to_dict(index)
        record["batch_size"] = self.tables.batch_size
        bound = self.balanced_bound_ms()
        record["balanced_bound_ms"] = round(bound, 6)
        record["ratio_to_balanced_bound"] = round(record["max_device_cost_ms"] / bound, 4) if bound > 0 else None
        return record

    @classmethod
    def from_plan(cls, plan: Plan, cost_models: CostModels, tables: TableSet | None = None,
                  batch_size: int | None = None) -> "Simulator":
        """The one simulator of a plan: its devices, weights and communication precision,
        optimizer, topology and row blocks (``provenance.row_blocks``), over ``tables``
        (default: the plan's own) at ``batch_size`` (default: the tables' batch; a measurement
        passes the batch it ran at)."""
        tables = tables if tables is not None else TableSet(plan.tables_name, list(plan.tables))
        if batch_size:
            tables = tables.at_batch(batch_size)
        tiers = plan.tiers() if plan.tiered else None
        return cls(tables, plan.num_devices, cost_models, plan.bytes_per_element, optimizer=plan.optimizer,
                   comm_precision=plan.comm_precision, topology=plan.topology,
                   tiers=None if tiers is None else [tiers[t.name] for t in tables], row_blocks=plan.row_blocks)

    def balanced_bound_ms(self) -> float:
        """Sum of the tables' predicted single-table compute costs over the devices: the
        per-device cost of a perfectly balanced plan without communication."""
        return float(self.single_costs_ms(whole_pieces(self.tables)).sum() / self.num_devices)


# ------------------------------------------------- replicated (data-parallel) tables
def _network(topology: Topology | None, num_devices: int, models: CostModels) -> tuple[Topology | None, str]:
    """(the topology the exchange is costed over, or None for the measured model; which
    model serves the exchange, in words, for the plan's provenance)."""
    if topology is not None and topology.hosts_stated:
        return topology, (f"analytic: bytes over the stated links ({topology.local_world_size} devices per host, "
                          f"{topology.intra_host_gbps:g} GB/s within a host, {topology.inter_host_gbps:g} GB/s "
                          f"across hosts)")
    counts = models.comm_device_counts()
    name = type(models.comm).__name__
    if counts and num_devices > COMM_EXTRAPOLATION * max(counts):
        local = default_local_world_size(num_devices)
        network = Topology(num_devices, local, DEFAULT_INTRA_HOST_GBPS, DEFAULT_INTER_HOST_GBPS)
        return network, (f"analytic: bytes over the GPU-cluster defaults ({local} devices per host, "
                         f"{DEFAULT_INTRA_HOST_GBPS:g} and {DEFAULT_INTER_HOST_GBPS:g} GB/s): the measured {name} "
                         f"covers {min(counts)}-{max(counts)} devices, this plan has {num_devices:,}")
    where = f" ({min(counts)}-{max(counts)} devices)" if counts else ""
    return None, f"measured: {name}{where}"


def replicated_bytes(sim: "Simulator", names: Sequence[str]) -> int:
    """Memory every device gives to the replicated tables ``names`` (weights and optimizer state)."""
    return tables_bytes((t for t in sim.tables if t.name in names), sim.bytes_per_element,
                        getattr(sim, "optimizer", DEFAULT_OPTIMIZER))


def allreduce_ms(sim: "Simulator", gradient_bytes: float) -> float:
    """Ring all-reduce of ``gradient_bytes`` over the simulator's devices, in ms: with a
    topology that states hosts, the ring's bytes over its slowest link (the inter-host
    bandwidth when there are several hosts); else the comm model's fitted reduction
    constants (call, per peer, per byte)."""
    devices = sim.num_devices
    if devices < 2 or gradient_bytes <= 0:
        return 0.0
    ring_bytes = 2.0 * (devices - 1) / devices * gradient_bytes
    topology = getattr(sim, "topology", None)
    if topology is not None and topology.hosts_stated:
        gbps = topology.inter_host_gbps if topology.num_hosts > 1 else topology.intra_host_gbps
        return float(ring_bytes / (gbps * 1e6))  # GB/s = 1e6 bytes per ms
    model = sim.cost_models.comm
    analytic = model if isinstance(model, AnalyticCommModel) else getattr(model, "analytic", None)
    one, per_peer, per_byte = (analytic.coefs[2] if analytic is not None else AnalyticCommModel.REDUCE_DEFAULTS)
    return float(one + per_peer * (devices - 1) + per_byte * ring_bytes)


def replicated_costs_ms(sim: "Simulator") -> tuple[float, float]:
    """(compute in the models' ms at the models' batch, all-reduce ms) per device of the
    simulator's replicated tables: the compute is for the local batch (1 / D of the batch),
    still to be scaled to the tables' batch like every compute figure."""
    names = set(sim.data_parallel_tables)
    pieces = [Piece(i, 0, t.num_embeddings, 0, t.embedding_dim) for i, t in enumerate(sim.tables) if t.name in names]
    if not pieces:
        return 0.0, 0.0
    ids = tuple(sorted(int(i) for i in sim.piece_ids(pieces)))
    compute = float(sim.set_costs_ms([ids])[0]) / sim.num_devices
    gradient_bytes = sum(float(FP32_BYTES) * sim.tables[p.table].num_embeddings * sim.tables[p.table].embedding_dim for p in pieces)
    return compute, allreduce_ms(sim, gradient_bytes)
