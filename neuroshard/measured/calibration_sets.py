"""Calibration's sets: the random device-sized sets it draws, and how it times them within a budget.

``random_sets`` draws the sets ``measured.calibrate.start_calibration`` times beside the tables
alone; ``timed_within_budget`` times both under a bounded ``measured.budget.Budget``: in runs of
``calibration_chunk`` sets, as many as fit in ``calibration_share`` of it. Memory: a timing run
allocates the weights of its largest set (rows capped) and keeps every set's batch of lookups for
all its passes, so sets are cut to about a device's share of the weights and runs to
``RUN_LOOKUP_BYTES`` of lookups (``Calibration.add``).
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..constants import FP32_BYTES, MIN_CALIBRATION_SETS
from ..costmodels.samples.timing import MEMORY_SHARE, available_memory_bytes
from ..tables import TableSet
from ..types import Piece

log = logging.getLogger("neuroshard.measured.calibrate")  # calibration's sets log as calibration

#: most weight bytes (rows capped) one measured set may take
MAX_SET_BYTES = 3 << 30
#: a random calibration set's weights (rows capped) at most this many times a device's share of the
#: task's (and at least its largest table, or SET_BYTES_FLOOR): a timing run allocates its largest
#: set's weights, and sets far above a device's share are not sets a plan makes (2 devices x 24
#: dlrm-2021 tables: a 2.4 GB buffer before)
SET_BYTES_OF_A_DEVICE = 1.25
#: ... sets of fewer weight bytes than this are never cut short (small tasks draw the sets they drew)
SET_BYTES_FLOOR = 512 << 20
#: the lookups of one calibration run at most (bytes, estimated): a run keeps every set's batch for all
#: its passes, so calibration times its sets in runs of about this much (224 sets in one run: 4 GB)
RUN_LOOKUP_BYTES = 256 << 20


def random_sets(tables: TableSet, devices: int, count: int, row_cap: int, rng: np.random.Generator):
    """``count`` random sets of pieces (Simulator ``Piece``s): about tables/devices pieces
    each, some halved by columns or cut into row halves, within ``MAX_SET_BYTES`` and within
    what the device timer may allocate now (``MEMORY_SHARE`` of the memory available, less a
    fifth for its buffers): a busy machine gets smaller sets, not a refusal mid-calibration; and
    within ``SET_BYTES_OF_A_DEVICE`` times a device's share of the tables' weights (or the largest
    table's), what plans put on a device."""
    per_device = max(1, round(len(tables) / devices))
    capped = [min(t.num_embeddings, row_cap) * t.embedding_dim * FP32_BYTES for t in tables]
    device_share = max(max(capped), SET_BYTES_FLOOR, int(SET_BYTES_OF_A_DEVICE * sum(capped) / max(devices, 1)))
    budget = min(MAX_SET_BYTES, device_share, int(0.8 * MEMORY_SHARE * available_memory_bytes()))
    sets = []
    for _ in range(count):
        size = int(rng.integers(max(1, per_device // 2), 3 * per_device + 1))
        chosen = rng.choice(len(tables), size=min(size, len(tables)), replace=False)
        pieces, used = [], 0
        for i in chosen:
            t = tables[int(i)]
            piece = Piece(int(i), 0, t.num_embeddings, 0, t.embedding_dim)
            if piece.can_halve_cols() and rng.random() < 0.3:
                piece = piece.halve_cols()[int(rng.integers(2))]
            elif piece.can_halve_rows() and rng.random() < 0.1:
                piece = piece.halve_rows()[int(rng.integers(2))]
            weight = min(piece.num_rows, row_cap) * piece.num_cols * FP32_BYTES
            if used + weight > budget:
                continue
            pieces.append(piece)
            used += weight
        if pieces:
            sets.append(pieces)
    return sets


def timed_within_budget(calibration: Any, singles: list, devices: int, sets: int, budget: Any) -> None:
    """``start_calibration`` under a bounded budget: the tables alone, then as many of ``sets`` random
    sets as the rate measured on the tables says fit in ``calibration_share`` of the budget (and in
    what the stages of more worth leave, ``Budget.room``), timed in runs of ``calibration_chunk``,
    the deadline checked before every run; the first run is short (its rate is guessed)."""
    config = budget.config
    end = budget.clock() + config.calibration_share * budget.seconds

    def room() -> float:
        return min(end - budget.clock(), budget.room("calibrate"))

    def timed(todo: list, kind: str, what: str) -> int:
        done, first = 0, min(4, config.calibration_chunk)  # a short first run: its rate is guessed
        while done < len(todo):
            fit = int(room() // max(budget.timing_s(1, 1), 1e-9))
            part = todo[done:done + min(first if done == 0 else config.calibration_chunk, fit)]
            if not part:
                break
            budget.say(what, done, len(todo))
            calibration.add(part, kind)
            done += len(part)
        return done

    tables_done = timed(singles, "table", "each table alone")
    if tables_done < len(singles):
        budget.skip("calibrate", f"{len(singles) - tables_done} of {len(singles)} tables alone and every random "
                                 f"set: {config.calibration_share:.0%} of the budget, less what is held for stages of "
                                 f"more worth, did not fit them; the pre-trained models plan")
        return
    fit = int(room() // max(budget.timing_s(1, 1), 1e-9))
    count = min(sets, fit)
    if count < MIN_CALIBRATION_SETS:
        budget.skip("calibrate", f"every random set: {fit} fit in what is left for calibration, it needs "
                                 f"{MIN_CALIBRATION_SETS}; the pre-trained models plan")
        return
    randoms = random_sets(calibration.tables, devices, count, calibration.row_cap, calibration.rng)
    log.info("calibration: timing %d tables alone and %d random sets on this machine (budget)", len(singles),
             len(randoms))
    done = timed(randoms, "random", "random sets")
    if done < MIN_CALIBRATION_SETS:
        budget.skip("calibrate", f"random sets: {done} timed before the calibration's time ran out, fewer than "
                                 f"{MIN_CALIBRATION_SETS}; the pre-trained models plan")
    elif done < sets:
        budget.skip("calibrate", f"{sets - done} of {sets} random sets: the budget's {config.calibration_share:.0%} "
                                 f"for calibration fits {done}")


__all__ = ["MAX_SET_BYTES", "SET_BYTES_OF_A_DEVICE", "SET_BYTES_FLOOR", "RUN_LOOKUP_BYTES", "random_sets",
           "timed_within_budget"]
