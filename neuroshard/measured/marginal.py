"""Marginal costs fitted to the timing runs themselves: what the rebalance estimates with.

By the time refine has chosen a plan, its comparison run and finalist runs have timed every
device of ~10 plans of the task's own tables, in the groupings plans actually use: ~10 x D
device sets. The models err most on exactly those sets, and the runs say what the sets cost
(docs/decisions.md#rebalance). So ``fit_marginal_costs`` fits each table's marginal cost *in
context* from them: a piece costs its alone-cost (the calibrated model's prediction of the piece
alone) times its table's factor, a device the sum of its pieces plus one launch level; the
factors shrink toward one shared factor by a ridge (the runs have fewer devices than the task
has tables; a factor is left where the devices it sits on say so). An ordinary least-squares
problem with a ridge toward a free shared mean, so ``numpy.linalg.lstsq`` on the stacked rows;
scikit-learn's ``Ridge`` shrinks toward zero, not toward a fitted mean.

A measured time is also one run's noise, and a greedy walk that trusts it moves work onto the
devices that happened to measure fast (the winner's curse). Given the noise of one run
(``run_noise_var``, from the plans refine timed more than once), the residual an estimate keeps
is shrunk by ``anchor_weight``: the share of a device's deviation from the fitted costs that is
its set's own rather than the run's (empirical Bayes: the fit's residuals hold both, their
variance less the noise's is the sets' own).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..types import Piece
from .config import DEFAULT_CONFIG


@dataclass
class MarginalCosts:
    """Each table's factor on its pieces' alone-costs (``factor_[t]``), the devices' launch
    level (``level_ms_``), and how well the fit reproduces the sets it was fitted on
    (``fit_error_``: the mean relative error; ``residual_var_``: the mean squared one)."""

    factor_: np.ndarray
    shared_: float
    level_ms_: float
    fit_error_: float
    sets_: int
    residual_var_: float = 0.0

    def piece_ms(self, pieces: Sequence[Piece], alone_ms: np.ndarray) -> np.ndarray:
        """The marginal cost (ms) of ``pieces`` whose alone-costs are ``alone_ms``."""
        return np.asarray(alone_ms, dtype=np.float64) * self.factor_[[p.table for p in pieces]]

    def devices_ms(self, where: np.ndarray, marginal_ms: np.ndarray, devices: int) -> np.ndarray:
        """(devices,) the fitted cost of each device: the launch level plus the marginal costs
        (``piece_ms``) of the pieces placed on it (``where``); 0 for a device holding none."""
        held = np.bincount(where, minlength=devices) > 0
        return np.where(held, self.level_ms_ + np.bincount(where, weights=marginal_ms, minlength=devices), 0.0)

    def to_dict(self) -> dict:
        return {"sets": self.sets_, "fit_error": round(self.fit_error_, 4), "shared_factor": round(self.shared_, 4),
                "level_ms": round(self.level_ms_, 4),
                "factor_range": [round(float(self.factor_.min()), 4), round(float(self.factor_.max()), 4)]}


def fit_marginal_costs(sets: Sequence[Sequence[Piece]], times_ms: np.ndarray, alone_ms: Callable[[list], np.ndarray],
                       num_tables: int, ridge: float = DEFAULT_CONFIG.marginal_ridge,
                       factor_range: tuple[float, float] = DEFAULT_CONFIG.factor_range) -> MarginalCosts:
    """Fit ``MarginalCosts`` to measured device ``sets`` (lists of pieces, non-empty) and their
    ``times_ms``; ``alone_ms(pieces)`` gives each piece's alone-cost (ms, the models')."""
    sets = [list(s) for s in sets]
    times = np.asarray(times_ms, dtype=np.float64)
    distinct = sorted({p for s in sets for p in s})
    alone = dict(zip(distinct, np.asarray(alone_ms(distinct), dtype=np.float64)))
    # unknowns: [level, shared, factor_0 .. factor_{T-1}]; each device a row, relative to its time
    rows = np.zeros((len(sets), 2 + num_tables))
    rows[:, 0] = 1.0
    for k, s in enumerate(sets):
        for p in s:
            rows[k, 2 + p.table] += alone[p]
    scale = 1.0 / np.maximum(times, 1e-9)
    a, b = rows * scale[:, None], np.ones(len(sets))
    # the ridge: sqrt(ridge) * (table's mean alone-cost / mean device time) * (factor_t - shared) = 0
    used = np.flatnonzero(rows[:, 2:].sum(axis=0) > 0)
    weight = rows[:, 2:].sum(axis=0)[used] / np.maximum((rows[:, 2:] > 0).sum(axis=0)[used], 1) / times.mean()
    penalty = np.zeros((len(used), 2 + num_tables))
    penalty[np.arange(len(used)), 2 + used] = np.sqrt(ridge) * weight
    penalty[:, 1] = -np.sqrt(ridge) * weight
    unused = np.setdiff1d(np.arange(num_tables), used)  # tables on no timed device: the shared factor
    tie = np.zeros((len(unused), 2 + num_tables))
    tie[np.arange(len(unused)), 2 + unused], tie[:, 1] = 1.0, -1.0
    x = np.linalg.lstsq(np.vstack([a, penalty, tie]), np.concatenate([b, np.zeros(len(used) + len(unused))]),
                        rcond=None)[0]
    if x[0] < 0:  # no negative launch level: fit again without one
        x = np.linalg.lstsq(np.vstack([a, penalty, tie])[:, 1:], np.concatenate([b, np.zeros(len(used) + len(unused))]),
                            rcond=None)[0]
        x = np.concatenate([[0.0], x])
    shared = float(x[1])
    factor = np.clip(x[2:], factor_range[0] * shared, factor_range[1] * shared)
    fitted = x[0] + rows[:, 2:] @ factor
    relative = fitted / times - 1
    return MarginalCosts(factor, shared, float(x[0]), float(np.mean(np.abs(relative))), len(sets),
                         float(np.mean(relative ** 2)))


def run_noise_var(repeats: Sequence[np.ndarray]) -> float | None:
    """The relative variance of one device's time in one run: each of ``repeats`` is one plan's
    devices timed in several runs ((runs, devices), ms); each device's times over their mean,
    their variance over the runs (ddof 1) pooled over every such device. None when no plan was
    timed twice."""
    deviations, dof = 0.0, 0
    for times in repeats:
        times = np.asarray(times, dtype=np.float64)
        if times.ndim != 2 or times.shape[0] < 2:
            continue
        mean = times.mean(axis=0)
        used = mean > 0
        if not used.any():
            continue
        deviations += float((((times[:, used] / mean[used]) - 1) ** 2).sum())
        dof += (times.shape[0] - 1) * int(used.sum())
    return deviations / dof if dof else None


def anchor_weight(costs: MarginalCosts, noise_var: float | None, runs: int = 1) -> float:
    """The share of a device's measured deviation from the fitted costs that an estimate keeps
    (see the module docstring): ``tau2 / (tau2 + noise_var / runs)``, where ``noise_var`` is one
    run's relative variance (``run_noise_var``), ``runs`` how many runs the anchor's times
    aggregate, and ``tau2 = residual_var_ - noise_var`` the sets' own variance (the fit's residuals
    are single runs' devices: they hold both). 1 (the measured time kept whole) without a noise
    estimate."""
    if noise_var is None or noise_var <= 0:
        return 1.0
    own = max(costs.residual_var_ - noise_var, 0.0)
    return own / (own + noise_var / max(int(runs), 1))


def anchored_estimate(where: np.ndarray, marginal: np.ndarray, measured_ms: np.ndarray, costs: MarginalCosts,
                      noise_var: float | None, runs: int) -> tuple[np.ndarray, float]:
    """Each device's estimate to start from (``measured.rebalance_walk``): its measured time with
    its deviation from the fitted cost shrunk by ``anchor_weight``; and that weight."""
    estimate = np.asarray(measured_ms, dtype=np.float64).copy()
    weight = anchor_weight(costs, noise_var, runs)
    if weight < 1.0:  # shrink each device's residual toward its fitted cost (the run's noise is not its set's)
        fitted = costs.devices_ms(where, marginal, len(estimate))
        estimate = fitted + weight * (estimate - fitted)
    return estimate, weight


__all__ = ["MarginalCosts", "fit_marginal_costs", "run_noise_var", "anchor_weight", "anchored_estimate"]
