"""The classic greedy heuristics: one loop, five sort keys.

Sort the shards by a key (largest first) and put each on the device with the lowest
accumulated key that has memory for it. Tables larger than a device are split first,
as for every algorithm (``rowwise.split_for_memory``); with memory tiers, a placement whose
row blocks TorchRec cannot run (``rowwise.RowBlockRule``) is split further, as one that
does not fit.

Keys (of a shard as a table of its own: rows ``R``, width ``W``, lookups per sample ``L``):

* ``random``: a random number per shard (a random balanced placement);
* ``size``: ``R x W`` (memory balance);
* ``dim``: ``W`` (communication balance);
* ``lookup``: ``W x L`` (bytes looked up per sample);
* ``size-lookup``: ``W x L x log10(R x W)`` (lookups, weighted up for large, cache-unfriendly shards).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InfeasibleError
from ..types import Piece, Placement
from .placer import greedy_place
from .rowwise import RowBlockRule, place_with_splits, strip_groups
from .simulator import Simulator

KeyFn = Callable[[Simulator, list[Piece], np.random.Generator], np.ndarray]


def _columns(pieces: list[Piece]) -> np.ndarray:
    return np.array([p.num_cols for p in pieces], dtype=np.float64)


def _sizes(pieces: list[Piece]) -> np.ndarray:
    return np.array([p.num_rows * p.num_cols for p in pieces], dtype=np.float64)


def _lookups(sim: Simulator, pieces: list[Piece]) -> np.ndarray:
    """Lookups per sample landing in each shard (the table's share of rows)."""
    tables = sim.tables
    return np.array([tables[p.table].pooling_factor * p.num_rows / tables[p.table].num_embeddings
                     for p in pieces], dtype=np.float64)


GREEDY_KEYS: dict[str, KeyFn] = {
    "random": lambda sim, pieces, rng: rng.random(len(pieces)),
    "size": lambda sim, pieces, rng: _sizes(pieces),
    "dim": lambda sim, pieces, rng: _columns(pieces),
    "lookup": lambda sim, pieces, rng: _columns(pieces) * _lookups(sim, pieces),
    "size-lookup": lambda sim, pieces, rng: _columns(pieces) * _lookups(sim, pieces) * np.log10(_sizes(pieces) + 10),
}


def greedy_by_key(sim: Simulator, memory_bytes: int, key: str, seed: int = 0) -> Placement:
    """The classic greedy with sort key ``key`` (one of ``GREEDY_KEYS``)."""
    key_fn = GREEDY_KEYS[key]
    rng = np.random.default_rng(seed)

    def place(pieces: list[Piece]) -> Placement | None:
        sizes = sim.sizes_bytes(pieces)
        # a strip's row blocks on distinct devices, as TorchRec runs them
        devices = greedy_place(key_fn(sim, pieces, rng), sizes, sim.num_devices, memory_bytes,
                               groups=strip_groups(pieces), host_size=sim.host_size,
                               **sim.placement_rules(pieces))[0]
        return Placement(pieces, devices) if devices[0] >= 0 and RowBlockRule(sim, pieces).keeps(devices) else None

    start = sim.memory_split(memory_bytes)
    placed = place_with_splits(start, place, sim.footprint, counts=sim.row_block_counts, allowed=sim.allowed)
    placed.cost_ms = float(sim.evaluate(placed.pieces, placed.devices[None, :]).max_ms[0])
    placed.details = {"parameters": {"key": key, "seed": seed}, "simulated_cost_ms": placed.cost_ms}
    return placed


def best_packing_greedy(sim: Simulator, memory_bytes: int, seed: int = 0) -> Placement | None:
    """The simulated cheapest of the greedy baselines that packs the tables into memory
    (None when none does); ``details['fallback']`` names it and what else was tried."""
    best, tried = None, {}
    for key in GREEDY_KEYS:
        try:
            placed = greedy_by_key(sim, memory_bytes, key, seed)
        except InfeasibleError:
            tried[key] = "could not pack"
            continue
        tried[key] = round(placed.cost_ms, 6)
        if best is None or placed.cost_ms < best[1].cost_ms:
            best = (key, placed)
    if best is None:
        return None
    key, placed = best
    placed.details["fallback"] = {"algorithm": key, "baselines": tried}
    return placed


@dataclass(frozen=True)
class GreedyBaseline:
    """One classic greedy heuristic as a search algorithm (``registry``); no parameters."""

    name: str
    params_type: type | None = None

    def search(self, sim: Simulator, memory_bytes: int, params: None = None, seed: int = 0) -> Placement:
        return greedy_by_key(sim, memory_bytes, self.name, seed)


RANDOM, SIZE, DIM, LOOKUP, SIZE_LOOKUP = (GreedyBaseline(key) for key in GREEDY_KEYS)
