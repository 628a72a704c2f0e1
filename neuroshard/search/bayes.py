"""Bayesian optimisation (optuna's TPE) over split decisions and the greedy's width cap.

A trial chooses, for each of the ``max_tables`` tables with the highest predicted
cost, how many times to halve its columns and into how many row ranges to split it,
and one per-device width cap; the greedy placement of ``placer.greedy_place``
places the result and the simulator scores it. Trials are asked in batches so one
simulator call scores a whole batch.
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict

import numpy as np

from ..types import Piece, Placement, split_rows, whole_pieces
from .params import BayesParams
from .placer import greedy_place
from .registry import SearchFunction
from .rowwise import RowBlockRule, place_with_splits, strip_groups
from .simulator import Simulator

log = logging.getLogger(__name__)


def search(sim: Simulator, memory_bytes: int, params: BayesParams | None = None, seed: int = 0) -> Placement:
    """The best of ``n_trials`` TPE trials (seeded)."""
    import optuna

    params = params or BayesParams()
    start = sim.memory_split(memory_bytes)
    start_strips: dict[Piece, int] = {}  # full-height column strip -> its row blocks after memory splits
    for piece in start:
        table = sim.tables[piece.table]
        strip = Piece(piece.table, 0, table.num_embeddings, piece.col_offset, piece.num_cols)
        start_strips[strip] = start_strips.get(strip, 0) + 1
    table_blocks = {}  # row blocks per table: the same for all its strips (a regular grid, see rowwise)
    for strip, blocks in start_strips.items():
        table_blocks[strip.table] = max(blocks, table_blocks.get(strip.table, 1))
    valid_rows = sim.row_block_counts
    table_costs = sim.single_costs_ms(whole_pieces(sim.tables))
    searched = [int(t) for t in np.argsort(-table_costs, kind="stable")[:params.max_tables]]
    mean_width = sim.total_dim / sim.num_devices

    def trial_state(trial: "optuna.trial.Trial") -> tuple[list[Piece], float]:
        halvings = {t: trial.suggest_int(f"col_halvings_{t}", 0, params.max_col_halvings) for t in searched}
        row_parts = {t: trial.suggest_int(f"row_parts_{t}", 1, params.max_row_parts) for t in searched}
        cap = mean_width * trial.suggest_float("cap_factor", 1.0, params.max_cap_factor)
        pieces: list[Piece] = []
        for strip in start_strips:  # whole strips: row splits stay TorchRec's ceil blocks
            parts = [strip]
            for _ in range(halvings.get(strip.table, 0)):
                parts = [h for p in parts for h in (p.halve_cols() if p.can_halve_cols() else (p,))]
            rows = row_parts.get(strip.table, 1)
            if rows > 1:  # the next row split TorchRec runs (one host's ranks, all ranks), at most all
                rows = min((p for p in valid_rows if p >= rows), default=valid_rows[-1])
            rows = max(rows, table_blocks[strip.table])
            pieces += [r for p in parts for r in split_rows(p, rows)]
        return sorted(pieces), math.ceil(cap)

    def greedy(pieces: list[Piece], cap: float) -> np.ndarray:
        ids = sim.piece_ids(pieces)
        return greedy_place(sim.single_costs_ms(ids), sim.bytes_of(ids), sim.num_devices, memory_bytes,
                            widths=sim.cols_of(ids), caps=np.array([cap], dtype=np.float64),
                            groups=strip_groups(pieces), host_size=sim.host_size,
                            **sim.placement_rules(pieces))[0]

    sampler = optuna.samplers.TPESampler(seed=seed)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="minimize", sampler=sampler)
        best: Placement | None = None
        for first in range(0, params.n_trials, params.batch):
            trials = [study.ask() for _ in range(min(params.batch, params.n_trials - first))]
            states = [trial_state(t) for t in trials]
            placed = [(pieces, greedy(pieces, cap)) for pieces, cap in states]
            feasible = [i for i, (pieces, devices) in enumerate(placed)  # packed, allowed by the constraints,
                        if _packed(sim, pieces, devices) and sim.allowed(pieces)]  # row blocks TorchRec runs
            costs = np.full(len(trials), np.inf)
            if feasible:
                costs[feasible] = sim.evaluate_many([placed[i] for i in feasible]).max_ms
            for trial, cost, (pieces, devices) in zip(trials, costs, placed):
                study.tell(trial, float(cost) if np.isfinite(cost) else 1e30)
                if np.isfinite(cost) and (best is None or cost < best.cost_ms):
                    best = Placement(pieces, devices, float(cost))
    finally:
        optuna.logging.set_verbosity(verbosity)

    if best is None:  # no trial packed: fall back to the unsplit state with extra memory splits
        log.info("no Bayesian trial fit in memory; placing with extra memory splits")
        best = place_with_splits(start, lambda pieces: _feasible(sim, pieces, greedy(pieces, math.inf)),
                                 sim.footprint, counts=sim.row_block_counts, allowed=sim.allowed)
    best.details = {"parameters": {**asdict(params), "seed": seed}, "simulated_cost_ms": best.cost_ms,
                    "best_trial": study.best_trial.params if study.best_value < 1e30 else None}
    return best


def _packed(sim: Simulator, pieces: list[Piece], devices: np.ndarray) -> bool:
    """Whether the greedy placed every piece, a strip's row blocks as TorchRec runs them
    where the search keeps that rule (``rowwise.RowBlockRule``: tiered plans)."""
    return bool((devices >= 0).all()) and RowBlockRule(sim, pieces).keeps(devices)


def _feasible(sim: Simulator, pieces: list[Piece], devices: np.ndarray) -> Placement | None:
    if not _packed(sim, pieces, devices):
        return None
    return Placement(pieces, devices, float(sim.evaluate(pieces, devices[None, :]).max_ms[0]))


ALGORITHM = SearchFunction("bayes", BayesParams, search)  # in the registry
