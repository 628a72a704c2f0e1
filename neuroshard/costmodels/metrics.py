"""The metrics every cost model reports, on the same held-out data.

* ``gmae``: geometric mean of the absolute relative error ``|pred - true| / true``, as
  Lin et al. report it for the iteration-time model (their ``gmae`` of ``abs_err``): the
  one error this project calls GMAE, for cost models, operators and iterations alike.
* ``ratio_error``: ``exp(mean |log(pred / true)|) - 1``, the geometric mean of the ratio
  ``max(pred/true, true/pred)`` less 1. Stricter than ``gmae`` (close to ``mape``);
  the iteration model's figures before 2026-11-28 were this, labelled GMAE.
* ``mape``: mean absolute relative error (a fraction; 0.05 = 5%).
* ``kendall_tau``: rank agreement between predictions and measurements.
* ``pair_accuracy``: build random pseudo-plans (``plan_size`` items each, plan cost =
  max over its items, as a plan's cost is its slowest device), draw random pairs of
  plans, and count how often the prediction orders a pair as the measurements do.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import kendalltau

#: relative errors below this count as this (keeps the geometric mean finite on exact hits)
_MIN_RELATIVE_ERROR = 1e-6


def relative_errors(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    pred, true = np.asarray(pred, dtype=np.float64).ravel(), np.asarray(true, dtype=np.float64).ravel()
    return np.abs(pred - true) / np.maximum(np.abs(true), 1e-12)


def gmae(pred: np.ndarray, true: np.ndarray) -> float:
    """Geometric mean of |pred - true| / true."""
    err = relative_errors(pred, true)
    return float(np.exp(np.mean(np.log(np.maximum(err, _MIN_RELATIVE_ERROR))))) if err.size else float("nan")


def ratio_error(pred: np.ndarray, true: np.ndarray) -> float:
    """``exp(mean |log(pred / true)|) - 1`` (module docstring; not GMAE)."""
    pred, true = np.asarray(pred, dtype=np.float64).ravel(), np.asarray(true, dtype=np.float64).ravel()
    if not pred.size:
        return float("nan")
    return float(np.exp(np.abs(np.log(np.maximum(pred, 1e-12) / np.maximum(true, 1e-12))).mean()) - 1.0)


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean of |pred - true| / true (a fraction)."""
    err = relative_errors(pred, true)
    return float(err.mean()) if err.size else float("nan")


def kendall_tau(pred: np.ndarray, true: np.ndarray) -> float:
    pred, true = np.asarray(pred).ravel(), np.asarray(true).ravel()
    if pred.size < 2:
        return float("nan")
    return float(kendalltau(pred, true).statistic)


def pair_accuracy_of_plans(pred_plans: np.ndarray, true_plans: np.ndarray, num_pairs: int = 20000,
                           seed: int = 0) -> float:
    """Share of random plan pairs (with different measured costs) that the prediction orders right."""
    pred_plans, true_plans = np.asarray(pred_plans, np.float64), np.asarray(true_plans, np.float64)
    n = pred_plans.size
    if n < 2:
        return float("nan")
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, n, num_pairs), rng.integers(0, n, num_pairs)
    true_diff, pred_diff = true_plans[a] - true_plans[b], pred_plans[a] - pred_plans[b]
    keep = (a != b) & (true_diff != 0)
    if not keep.any():
        return float("nan")
    return float(np.mean(np.sign(pred_diff[keep]) == np.sign(true_diff[keep])))


def pair_accuracy(pred: np.ndarray, true: np.ndarray, plan_size: int = 4, num_plans: int = 2000,
                  num_pairs: int = 20000, seed: int = 0) -> float:
    """Plan-pair ordering accuracy: items grouped at random into ``num_plans`` plans of ``plan_size``
    (plan cost = max over its items), then ``pair_accuracy_of_plans``."""
    pred, true = np.asarray(pred, np.float64).ravel(), np.asarray(true, np.float64).ravel()
    if pred.size < plan_size:
        return float("nan")
    rng = np.random.default_rng(seed)
    members = np.stack([rng.choice(pred.size, size=plan_size, replace=False) for _ in range(num_plans)])
    return pair_accuracy_of_plans(pred[members].max(axis=1), true[members].max(axis=1), num_pairs, seed + 1)


def cost_metrics(pred: np.ndarray, true: np.ndarray, plan_size: int = 4, seed: int = 0) -> dict:
    """All four metrics of per-item predictions (compute: one item per shard set)."""
    return {"gmae": gmae(pred, true), "mape": mape(pred, true), "kendall_tau": kendall_tau(pred, true),
            "pair_accuracy": pair_accuracy(pred, true, plan_size=plan_size, seed=seed), "n": int(np.size(true))}


def plan_metrics(preds: Sequence[np.ndarray], trues: Sequence[np.ndarray], seed: int = 0) -> dict:
    """Metrics of per-device predictions: ``preds[i]``, ``trues[i]`` of shape (P_i, D_i), one pair per
    device count. GMAE, MAPE and Kendall tau over all devices; pair accuracy over whole samples (a
    sample is a plan: its cost is the max over devices), pairs of equal device count."""
    pred = np.concatenate([np.ravel(p) for p in preds])
    true = np.concatenate([np.ravel(t) for t in trues])
    scores = np.array([pair_accuracy_of_plans(p.max(axis=1), t.max(axis=1), seed=seed) for p, t in zip(preds, trues)])
    weights = np.array([len(t) for t in trues], dtype=np.float64)
    ok = np.isfinite(scores)
    return {"gmae": gmae(pred, true), "mape": mape(pred, true), "kendall_tau": kendall_tau(pred, true),
            "pair_accuracy": float(np.average(scores[ok], weights=weights[ok])) if ok.any() else float("nan"),
            "n": int(true.size)}


def comm_predictions(model, groups: Sequence) -> dict:
    """{direction: (predictions, measurements)}, lists of (P, D) arrays per group; the reduction only
    over samples that reduce, as (P, 1)."""
    out: dict = {"fwd": ([], []), "bwd": ([], []), "reduce": ([], [])}
    for g in groups:
        out["fwd"][0].append(model.predict_forward(g.widths, g.skews_ms))
        out["fwd"][1].append(g.fwd_ms)
        out["bwd"][0].append(model.predict_backward(g.widths))
        out["bwd"][1].append(g.bwd_ms)
        r = g.reducing()
        if len(r):
            out["reduce"][0].append(model.predict_reduce(r.reduce_width, r.num_devices)[:, None])
            out["reduce"][1].append(r.reduce_ms_per_sample[:, None])
    return out


def comm_metrics(model, groups: Sequence, seed: int = 0) -> dict:
    """Metrics per direction (``fwd``, ``bwd``, ``reduce``) over ``CommSamples`` groups (see ``plan_metrics``)."""
    return {direction: plan_metrics(preds, trues, seed)
            for direction, (preds, trues) in comm_predictions(model, groups).items() if preds}
