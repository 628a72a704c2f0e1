"""measured-greedy: what a careful engineer without a cost model does, and the baseline to beat.

1. Cut every table larger than half a device into equal row blocks
   (``rowwise.split_rows``, the fewest blocks of at most half a device).
2. Time each unit alone on this machine: its fused kernel, forward + backward + update,
   with ``neuroshard measure``'s protocol (``costmodels.samples.timing.time_devices``: one
   pinned thread or one GPU, cache flush, interleaved passes beside a reference device).
3. Place units largest-measured-first on the least-loaded device (sum of measured
   times) that still has memory for them; when nothing fits, halve the largest unit
   (``rowwise.place_with_splits``) and time the new halves.

It needs the hardware the plan is for: it measures, it does not predict. Timing runs
at the cost models' batch size (costs are compared with each other only).
"""
from __future__ import annotations

import logging
import math

import numpy as np

from ..constants import trained_precision
from ..costmodels.samples.store import cpu_model
from ..costmodels.samples.timing import device_figures, time_devices
from ..search.params import MeasuredGreedyParams
from ..search.placer import greedy_place
from ..search.registry import SearchFunction
from ..search.rowwise import place_with_splits, split_for_memory
from ..search.simulator import Simulator
from ..types import Piece, Placement, split_rows, whole_pieces

log = logging.getLogger(__name__)


def _units(sim: Simulator, memory_bytes: int) -> list[Piece]:
    """Every table, those over half a device cut into the fewest equal row blocks that fit
    in half a device (column halves first only when a single row is still too large)."""
    half = float(np.max(memory_bytes)) / 2  # per-device memory: the largest
    out = []
    for piece in whole_pieces(sim.tables):
        size = sim.footprint.of(piece)
        if sim.constraints is not None and sim.constraints[piece.table].any:  # the layout its constraints allow
            out.extend(p for p in sim.memory_split(memory_bytes) if p.table == piece.table)
        elif size <= half:
            out.append(piece)
        elif sim.footprint.row_bytes(piece) <= half:
            out.extend(split_rows(piece, math.ceil(size / half)))
        else:
            out.extend(split_for_memory([piece], int(half), sim.footprint))
    return out


def search(sim: Simulator, memory_bytes: int, params: MeasuredGreedyParams | None = None,
           seed: int = 0) -> Placement:
    """The measured-greedy plan of ``sim``'s tables (see the module docstring; deterministic:
    ``seed`` is accepted for the common interface)."""

    params = params or MeasuredGreedyParams()
    batch = params.batch_size or sim.cost_models.batch_size
    measured: dict[Piece, float] = {}

    def measure(pieces: list[Piece]) -> None:
        todo = [p for p in dict.fromkeys(pieces) if p not in measured]
        if not todo:
            return
        log.info("measured-greedy: timing %d units alone on this machine (batch %d)", len(todo), batch)
        shards = [sim.to_shards([p], np.zeros(1, dtype=np.int64)) for p in todo]
        times, config = time_devices(shards, sim.tables, passes=params.passes, repeats=params.repeats,
                                 batch_size=batch, row_cap=params.row_cap, kernel=params.kernel,
                                 weights_precision=trained_precision(sim.bytes_per_element))
        measured.update(zip(todo, device_figures(times, config)))


    def place(pieces: list[Piece]) -> Placement | None:
        measure(pieces)
        costs = np.array([measured[p] for p in pieces])
        sizes = sim.sizes_bytes(pieces)
        devices = greedy_place(costs, sizes, sim.num_devices, memory_bytes, **sim.placement_rules(pieces))[0]
        if devices[0] < 0:
            return None
        load = np.bincount(devices, weights=costs, minlength=sim.num_devices)
        return Placement(pieces, devices, details={"measured_load_ms": load.round(4).tolist()})

    placed = place_with_splits(_units(sim, memory_bytes), place, sim.footprint, allowed=sim.allowed)
    placed.cost_ms = float(sim.evaluate(placed.pieces, placed.devices[None, :]).max_ms[0])
    placed.details.update(parameters={"passes": params.passes, "repeats": params.repeats, "batch_size": batch,
                                      "row_cap": params.row_cap, "kernel": params.kernel,
                                      "measured_on": cpu_model()},
                          simulated_cost_ms=placed.cost_ms, units_timed=len(measured))
    return placed


ALGORITHM = SearchFunction("measured-greedy", MeasuredGreedyParams, search)  # in the registry
