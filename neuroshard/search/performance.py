"""The simulator's performance estimate: a placement of shards -> predicted per-device cost.

Per device ``d`` of one candidate plan (all in ms at the tables' batch size)::

    compute_d = compute model on the set of shards on d (one fused kernel)
    bwd_d, fwd_d = the all-to-all of d's columns (``exchange_cost``; forward waits for
                   the slowest device)
    total_d   = compute_d + fwd_d + bwd_d;   cost of the plan = max_d total_d

Data-parallel tables (``Storage.data_parallel_tables``, see ``replicate``) are not pieces:
every device adds their compute at its local batch to ``compute_d`` and pays
``allreduce_d``, the all-reduce of their gradients. A table's memory tier adds its traffic
(misses over the host link, SSD reads: ``costmodels.tiers``) to its device's compute. A
device's relative speed (``topology``) divides its compute.

Precision. ``compute_d`` is for the weights' precision (``bytes_per_element`` 2: fp16): a
compute model measured at another precision is scaled by the measured ratio of the two
(``compute_factor``, ``costmodels.precision``).

Search evaluates thousands of candidates, so the estimate takes many at once: one
compute-model call for every shard set not seen before (set costs are cached, keyed by
the sorted piece ids, ``pieces.PieceIndex``), and one call per communication term for the
whole ``(candidates, devices)`` array.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from ..constants import FP32_BYTES
from ..costmodels.base import CostModels
from ..costmodels.tiers import TierCostModel
from ..tables import TableSet
from ..topology import Topology
from ..types import Estimate, Piece, whole_pieces
from .exchange_cost import ExchangeCost, ring_allreduce_ms
from .pieces import PieceIndex
from .storage import Storage

#: the compute model is called on at most this many sets at once
_PREDICT_CHUNK = 20000


class Performance:
    """Predicted costs of placements of ``tables`` on ``num_devices`` devices, under the
    memory rules of ``storage`` (tiers, replicated tables) and the exchange of ``exchange``.

    Single-piece costs and per-id arrays (features, widths, strips, sizes, tier traffic) are
    kept by piece id, set costs in a dict keyed by sorted id tuples, so a piece or a
    device's set is never costed twice; copies for other tiers or replicated tables
    (``with_tiers``, ``with_data_parallel``) share the pieces and the set costs."""

    def __init__(self, tables: TableSet, num_devices: int, cost_models: CostModels, storage: Storage,
                 exchange: ExchangeCost, *, scale: float, compute_factor: float, risk: float | None,
                 topology: Topology | None):
        self.tables = tables
        self.num_devices = num_devices
        self.cost_models = cost_models
        self.storage = storage
        self.exchange = exchange
        self.scale = scale
        self.compute_factor = compute_factor
        self.topology = topology
        self._speed = None if topology is None or topology.relative_speed is None else topology.speeds()
        self._tier_model: TierCostModel | None = None  # shared by ``with_tiers`` copies: same tables and links
        #: a ``costmodels.samples.tiers.TierMeasurement`` to cost the tiers with (None: analytic)
        self.tier_costs: Any = None
        self._replicated_ms: tuple[float, float] | None = None
        self.index = PieceIndex(tables, cost_models)
        self._arrays: dict[str, np.ndarray] = {}  # per-id arrays, rebuilt when pieces were added
        self._single_ms = np.zeros(0)              # single-piece cost per id (NaN: not yet predicted)
        self._set_costs: dict[tuple[int, ...], float] = {}
        # An ensemble's spread (std of its members' log ms) per set: the search charges
        # mean x exp(risk x spread), so it prefers a plan only beyond the models' disagreement.
        self._with_spread = getattr(cost_models.compute, "predict_with_spread", None)
        self.risk = (1.0 if self._with_spread else 0.0) if risk is None else float(risk)
        self._set_spread: dict[tuple[int, ...], float] = {}
        self._class_costs: dict[tuple[int, ...], tuple[float, float]] = {}  # sorted classes -> (ms, spread)
        self.model_calls = 0
        self.sets_predicted = 0

    # ----------------------------------------------------------------- copies
    def with_tiers(self, storage: Storage) -> "Performance":
        """A copy under ``storage``'s other tiers (set costs kept: the kernels are the same)."""
        other = copy.copy(self)
        other.storage = storage
        other._arrays = {}
        other._single_ms = np.full(len(self.index), np.nan)
        return other

    def with_tier_costs(self, measured: Any) -> "Performance":
        """A copy whose tiers are costed with ``measured`` (None: the analytic model)."""
        other = copy.copy(self)
        other.tier_costs = measured
        other._tier_model = None
        return other

    def with_data_parallel(self, storage: Storage) -> "Performance":
        """A copy under ``storage``'s replicated tables."""
        other = copy.copy(self)
        other.storage = storage
        other._replicated_ms = None
        return other

    def tier_model(self) -> TierCostModel:
        """The tiers' cost model for these tables and topology (its miss-rate curves kept),
        with the measured miss path of ``tier_costs`` when set."""
        if self._tier_model is None:
            self._tier_model = TierCostModel(self.topology, self.num_devices, self.tables.batch_size,
                                             self.storage.bytes_per_element, self.storage.optimizer,
                                             measured=self.tier_costs)
        return self._tier_model

    # ----------------------------------------------------------------- pieces
    def piece_ids(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Stable small integers for ``pieces`` (``PieceIndex.ids_of``)."""
        return self.index.ids_of(pieces)

    def piece(self, pid: int) -> Piece:
        return self.index.pieces[pid]

    def _array(self, name: str) -> np.ndarray:
        seen = self.index.pieces
        if len(self._arrays.get("cols", ())) != len(seen):
            pieces = np.array(seen, dtype=np.int64).reshape(-1, 5)
            tiers = self.storage.tiers
            # what each piece's tier adds to its device (ms at the models' batch; 0 in device memory)
            tier_ms = np.zeros(len(seen)) if tiers is None else np.array(
                [self.tier_model().shard_ms(self.tables[p.table], tiers[p.table], p.num_rows, p.num_cols)
                 for p in seen]) / self.scale
            self._arrays = {"tier_ms": tier_ms,
                            "features": self.index.features_array(),
                            "cols": pieces[:, 4].astype(np.float64),
                            # a number per column strip (table, first column, width): row blocks share it
                            "strip": np.unique(pieces[:, [0, 3, 4]], axis=0, return_inverse=True)[1].reshape(-1),
                            "bytes": self.storage.bytes_array(pieces)}
            grown = np.full(len(seen), np.nan)
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

    # ---------------------------------------------------------------- compute
    def set_costs_ms(self, sets: Sequence[tuple[int, ...]], risk: float | None = None) -> np.ndarray:
        """Compute cost (ms at the models' batch size) of each set of piece ids (sorted
        tuples); the model is called once for all sets not seen before. With an ensemble,
        ``mean x exp(risk x spread)`` (``risk`` defaults to the simulator's; 0: the mean).

        Sets of pieces with the same features (a table's two equal column halves) are one
        set to the model: predicted once, their rows in one canonical order, so they cost
        exactly the same. Predicted apart, in different batches of the model, they differed
        in the last bits, and which of two equal pieces the search split or placed first
        depended on the CPU's float rounding (the same tables planned differently on an
        AMD EPYC and an Intel Xeon)."""
        known = self._set_costs
        missing = list({s for s in sets if s and s not in known})
        if missing:
            classes = self.index.classes()
            keys = [tuple(sorted(classes[list(s)].tolist())) for s in missing]
            by_key = self._class_costs
            todo = list(dict.fromkeys(k for k in keys if k not in by_key))
            for start in range(0, len(todo), _PREDICT_CHUNK):
                chunk = todo[start:start + _PREDICT_CHUNK]
                features = [np.stack([self.index.class_rows[c] for c in key]) for key in chunk]
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

    def single_costs_ms(self, pieces: Sequence[Piece] | np.ndarray) -> np.ndarray:
        """Predicted compute cost of each piece alone (pieces or their ids), at the tables'
        batch size."""
        ids = pieces if isinstance(pieces, np.ndarray) else self.piece_ids(pieces)
        self._array("cols")  # grow the per-id arrays
        todo = np.unique(ids[np.isnan(self._single_ms[ids])])
        if len(todo):
            self._single_ms[todo] = self.set_costs_ms([(int(i),) for i in todo]) + self._array("tier_ms")[todo]
        return self._single_ms[ids] * self.scale

    def balanced_bound_ms(self) -> float:
        """Sum of the tables' predicted single-table compute costs over the devices: the
        per-device cost of a perfectly balanced plan without communication."""
        return float(self.single_costs_ms(whole_pieces(self.tables)).sum() / self.num_devices)

    def _tier_load(self, ids: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """(D,) ms the tiers of pieces ``ids`` on ``devices`` add to each device (models' batch)."""
        return np.bincount(np.asarray(devices, dtype=np.int64), weights=self._array("tier_ms")[ids],
                           minlength=self.num_devices)

    def _device_compute(self, compute: np.ndarray, tiered: np.ndarray | None) -> np.ndarray:
        """(P, D) set costs (ms at the models' batch) with what every device adds: its tiers'
        traffic (modelled), the replicated tables' lookups; divided by its relative speed."""
        if tiered is not None:  # the tiers' traffic (misses over the host link, SSD reads), modelled
            compute = compute + tiered
        if self.storage.data_parallel_tables:  # every device looks up the replicated tables for its slice
            compute = compute + self.replicated_ms()[0]
        if self._speed is not None:  # a device twice as fast computes in half the time
            compute = compute / self._speed
        return compute

    # ------------------------------------------------- data-parallel tables
    def replicated_ms(self) -> tuple[float, float]:
        """(compute at the local batch in the models' ms, all-reduce ms) every device pays for
        the replicated tables (``replicated_costs_ms``), computed once."""
        if self._replicated_ms is None:
            self._replicated_ms = self.replicated_costs_ms()
        return self._replicated_ms

    def replicated_costs_ms(self) -> tuple[float, float]:
        """(compute in the models' ms at the models' batch, all-reduce ms) per device of the
        replicated tables: the compute is for the local batch (1 / D of the batch), still to
        be scaled to the tables' batch like every compute figure."""
        names, tables = set(self.storage.data_parallel_tables), self.tables
        pieces = [Piece(i, 0, t.num_embeddings, 0, t.embedding_dim) for i, t in enumerate(tables) if t.name in names]
        if not pieces:
            return 0.0, 0.0
        ids = tuple(sorted(int(i) for i in self.piece_ids(pieces)))
        compute = float(self.set_costs_ms([ids])[0]) / self.num_devices
        gradient_bytes = sum(float(FP32_BYTES) * tables[p.table].num_embeddings * tables[p.table].embedding_dim
                             for p in pieces)
        return compute, ring_allreduce_ms(self.num_devices, self.topology, self.cost_models.comm, gradient_bytes)

    # ---------------------------------------------------------------- exchange
    def _widths(self, ids: np.ndarray, devices: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``ExchangeCost.widths`` of pieces ``ids`` on ``devices``."""
        cols = self.cols_of(ids)
        strips = self._array("strip")[ids] if self.exchange.hosts_stated else None
        return self.exchange.widths(cols, strips, devices)

    def _with_comm(self, compute: np.ndarray, widths: np.ndarray, reduce_bytes: np.ndarray | None = None
                   ) -> Estimate:
        """The estimate of plans whose per-device compute is ``compute`` (P, D), in ms at
        the models' batch size: the communication terms added (forward waiting included)."""
        num, dev = compute.shape
        fwd, bwd, reduce, intra, inter = self.exchange.terms(compute, widths, reduce_bytes)
        # the all-reduce of replicated tables' gradients does not grow with the batch: not scaled
        allreduce = np.full((num, dev), self.replicated_ms()[1]) if self.storage.data_parallel_tables else None
        return Estimate(compute * self.scale, fwd * self.scale, bwd * self.scale, reduce * self.scale, allreduce,
                        intra, inter)

    def exchange_ms(self, pieces: Sequence[Piece], devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(D,) forward and (D,) backward all-to-all ms of a placement's exchange, without
        waiting for other devices (``ExchangeCost.alone_ms``), at the tables' batch size."""
        widths, reduce_bytes = self._widths(self.piece_ids(pieces), devices)
        return self.exchange.alone_ms(widths, reduce_bytes)

    # -------------------------------------------------------------- estimates
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
        reduce_bytes = np.zeros((num, dev)) if self.exchange.hosts_stated else None
        set_keys: list[tuple[int, ...]] = []
        tiered = np.zeros((num, dev)) if self.storage.tiers is not None else None
        for p, (ids, devices) in enumerate(candidates):
            devices = np.asarray(devices, dtype=np.int64)
            if tiered is not None:
                tiered[p] = self._tier_load(ids, devices)
            widths[p], reduced = self._widths(ids, devices)
            if reduced is not None:
                reduce_bytes[p] = reduced
            order = np.lexsort((ids, devices))
            bounds = np.searchsorted(devices[order], np.arange(dev + 1)).tolist()
            sorted_ids = ids[order].tolist()
            set_keys.extend(tuple(sorted_ids[bounds[d]:bounds[d + 1]]) for d in range(dev))
        compute = self._device_compute(self.set_costs_ms(set_keys, risk).reshape(num, dev), tiered)
        return self._with_comm(compute, widths, reduce_bytes)

    def evaluate_with_compute(self, candidates: Sequence[tuple[Sequence[Piece], np.ndarray]],
                              compute_ms: np.ndarray) -> Estimate:
        """Estimates of ``P`` placements whose per-device compute is given ((P, D) ms at the
        tables' batch size, e.g. measured): only communication is predicted."""
        placed = [(self.piece_ids(pieces), np.asarray(devices)) for pieces, devices in candidates]
        exchanges = [self._widths(ids, devices) for ids, devices in placed]
        widths = np.stack([w for w, _ in exchanges])
        reduce_bytes = None if exchanges[0][1] is None else np.stack([r for _, r in exchanges])
        compute = np.asarray(compute_ms, dtype=np.float64) / self.scale
        if self.storage.tiers is not None:  # a measured kernel does not include the tiers' traffic: modelled
            compute = compute + np.stack([self._tier_load(ids, devices) for ids, devices in placed])
        return self._with_comm(compute, widths, reduce_bytes)

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
        tier_ms = None if self.storage.tiers is None else self._array("tier_ms")[ids]
        base_tier = None if tier_ms is None else self._tier_load(ids, devices)
        base_widths, base_reduce = self._widths(ids, devices)
        blocks = None
        if self.exchange.hosts_stated:  # row blocks: moving one may change its strip's table-row-wise layout
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
                    widths[p], reduce[p] = self._widths(ids, moved)
                else:
                    for i, new in move:
                        widths[p, devices[i]] -= cols[i]
                        widths[p, new] += cols[i]
            if where:
                at = np.array(where, dtype=np.int64)
                sets[at[:, 0], at[:, 1]] = self.set_costs_ms(keys)
            out[start:start + num] = self._with_comm(self._device_compute(sets, tiered), widths, reduce).max_ms
        return out
