"""Operator cost models: the dense part of a training step and its overheads.

Lin et al. predict a DLRM step from per-operator performance models plus overheads; this
module holds the operator models of the included runtime's step, fitted on samples that
``collect dense`` measures on the machine (``costmodels.samples.dense``). One
``OperatorModels`` is a scikit-learn estimator: hyper-parameters in ``__init__``, ``fit``
sets ``models_`` (one regression per operator kind and target) and ``metrics_`` (each one's
held-out error, from ``folds``-fold cross-validation over the samples' shapes).

Forms, per kind (``FORMS``):

* ``log``: log ms as a polynomial (``DEGREES``: 3 for linear layers and all-reduces, 2
  for the rest) of the log shape, ridge-regularised (scikit-learn ``PolynomialFeatures`` +
  ``Ridge``). Outside the measured shapes the shape is clipped to the measured range and
  the time scaled by the work (``_work``) the clipping removed: cost beyond the range grows
  with the work, not with the polynomial's tail. Used for the layers (``linear``,
  ``interaction_dot``, ``interaction_cat``, ``loss``) and ``allreduce``
  (by bytes and ranks: on a CPU shared by more processes than cores its latency is not
  linear in the ranks).
* ``linear``: ms as non-negative constants times the terms of ``_linear_terms`` (a
  physically shaped law, fitted by NNLS on relative error): ``optimizer`` (per call, per
  parameter, per tensor), ``input`` (a rank's data loading: per call, per table sampled,
  per lookup drawn from a reuse histogram, per lookup drawn otherwise (zipf, uniform: another
  sampler), per shard, per lookup kept) and ``barrier`` (per call, per peer).
* ``share``: a constant fraction, the median of the samples': ``embedding_split``, the
  forward's share of a fused embedding kernel's forward + backward.

The file (``neuroshard.operator-costs/v1``, docs/formats.md) keeps the samples, the
hyper-parameters, the hardware and the metrics; reading it refits (milliseconds), so the
file holds measurements, not a pickled estimator.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import nnls
from sklearn.base import BaseEstimator
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from ..constants import ITERATION_TERMS
from ..errors import FormatError, NeuroShardError
from ..io import atomic_write_text
from ..validate import is_int, read_json
from .metrics import gmae, relative_errors
from .samples.store import MACHINE_OPERATORS_FILE, this_machine_file

log = logging.getLogger(__name__)

OPERATOR_COSTS_FORMAT = "neuroshard.operator-costs/v1"
#: the overhead points' name for the whole period (``with_period``), beside the terms' names
ITERATION_KEY = "iteration_ms"

#: each kind's shape, in the order ``Operator.features`` and the samples give it
FEATURES: dict[str, tuple[str, ...]] = {
    "linear": ("batch", "in", "out", "relu"),
    "interaction_dot": ("batch", "features", "width"),
    "interaction_cat": ("batch", "width"),
    "loss": ("batch",),
    "optimizer": ("parameters", "tensors"),
    "input": ("tables", "lookups_histogram", "lookups_other", "shards", "lookups_kept"),
    "allreduce": ("bytes", "ranks"),
    "barrier": ("ranks",),
    "embedding_split": ("shards",),
}
#: the targets of each kind: layers have a forward and a backward time
TARGETS: dict[str, tuple[str, ...]] = {
    **{k: ("fwd_ms", "bwd_ms") for k in ("linear", "interaction_dot", "interaction_cat", "loss")},
    **{k: ("ms",) for k in ("optimizer", "input", "allreduce", "barrier")},
    "embedding_split": ("fwd_share",),
}
FORMS: dict[str, str] = {
    **{k: "log" for k in ("linear", "interaction_dot", "interaction_cat", "loss", "allreduce")},
    **{k: "linear" for k in ("optimizer", "input", "barrier")},
    "embedding_split": "share",
}


def _work(kind: str, x: np.ndarray) -> np.ndarray:
    """The work of ``log`` kinds' shapes ``x`` (N, F): what their time grows with beyond the
    measured range."""
    if kind == "linear":
        return x[:, 0] * x[:, 1] * x[:, 2]
    if kind == "interaction_dot":
        return x[:, 0] * x[:, 1] * x[:, 1] * x[:, 2]
    if kind == "interaction_cat":
        return x[:, 0] * x[:, 1]
    return x[:, 0]  # loss: batch; allreduce: bytes


def _linear_terms(kind: str, x: np.ndarray) -> np.ndarray:
    """The terms (N, T) a ``linear`` kind's time is a non-negative combination of."""
    ones = np.ones(len(x))
    if kind == "input":
        return np.column_stack([ones, x[:, 0], x[:, 1], x[:, 2], x[:, 3], x[:, 4]])
    if kind == "optimizer":  # per call, per parameter, per tensor
        return np.column_stack([ones, x[:, 0], x[:, 1]])
    return np.column_stack([ones, x[:, 0] - 1])  # barrier


#: the ``log`` form's polynomial degree per kind (the shapes with most samples and curvature get 3)
DEGREES = {"linear": 3, "allreduce": 3, "interaction_dot": 2, "interaction_cat": 3, "loss": 2}


class _LogModel:
    """``log`` form for one kind and target (see the module docstring)."""

    def __init__(self, kind: str, degree: int, alpha: float) -> None:
        self.kind, self.degree, self.alpha = kind, degree, alpha

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        """The log shape, and for the layers the log of their work and bytes (GEMM and copy
        efficiency change with them: the polynomial then needs fewer terms to follow it)."""
        logs = np.log(np.maximum(x, 1.0))
        if self.kind == "linear":
            b, i, o = x[:, 0], x[:, 1], x[:, 2]
            return np.column_stack([logs[:, :3], x[:, 3], np.log(b * i * o), np.log(b * i + i * o + b * o)])
        if self.kind == "interaction_dot":
            b, n, w = x[:, 0], x[:, 1], x[:, 2]
            return np.column_stack([logs, np.log(b * n * n * w), np.log(b * n * w)])
        if self.kind == "interaction_cat":
            return np.column_stack([logs, np.log(x[:, 0] * x[:, 1])])
        return logs

    def fit(self, x: np.ndarray, y: np.ndarray) -> "_LogModel":
        self.low_, self.high_ = x.min(axis=0), x.max(axis=0)
        self.pipe_ = make_pipeline(StandardScaler(), PolynomialFeatures(self.degree), Ridge(alpha=self.alpha))
        self.pipe_.fit(self._inputs(x), np.log(np.maximum(y, 1e-6)))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        clipped = np.clip(x, self.low_, self.high_)
        ms = np.exp(self.pipe_.predict(self._inputs(clipped)))
        return ms * _work(self.kind, x) / np.maximum(_work(self.kind, clipped), 1e-12)


class _LinearModel:
    """``linear`` form (see the module docstring)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def fit(self, x: np.ndarray, y: np.ndarray) -> "_LinearModel":
        terms = _linear_terms(self.kind, x)
        weight = 1.0 / np.maximum(y, 1e-6)  # relative error: small calls count as much as big ones
        self.coef_, _ = nnls(terms * weight[:, None], y * weight)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return _linear_terms(self.kind, x) @ self.coef_


class _ShareModel:
    """``share`` form: the median of the samples' values."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> "_ShareModel":
        self.value_ = float(np.median(y))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.full(len(x), self.value_)


def _arrays(samples: Sequence[Mapping], kind: str, target: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [s for s in samples if s["kind"] == kind]
    x = np.array([s["features"] for s in rows], dtype=np.float64).reshape(len(rows), len(FEATURES[kind]))
    if target == "fwd_share":
        y = np.array([s["fwd_ms"] / s["ms"] for s in rows], dtype=np.float64)
    else:
        y = np.array([s[target] for s in rows], dtype=np.float64)
    return x, y


def _nearest_ranks(per_ranks: Mapping[int, Any], ranks: int) -> int:
    """The rank count of ``per_ranks`` nearest ``ranks`` (the smaller on a tie)."""
    return min(per_ranks, key=lambda r: (abs(r - ranks), r))


class OperatorModels(BaseEstimator):
    """The operator cost models of one machine (see the module docstring)."""

    def __init__(self, extra_degree: int = 0, alpha: float = 1.0, folds: int = 5, seed: int = 0) -> None:
        self.extra_degree = extra_degree  # added to every kind's ``DEGREES`` (0: as measured best)
        self.alpha = alpha
        self.folds = folds
        self.seed = seed

    def _model(self, kind: str):
        form = FORMS[kind]
        if form == "log":
            return _LogModel(kind, DEGREES[kind] + self.extra_degree, self.alpha)
        return _LinearModel(kind) if form == "linear" else _ShareModel()

    def fit(self, samples: Sequence[Mapping], hardware: Mapping | None = None,
            overhead_points: Sequence[Mapping] = ()) -> "OperatorModels":
        """Fit every kind the samples have, the held-out error of each from cross-validation,
        and the overheads of real runs (``overhead_points``, see ``with_overheads``)."""
        self.samples_ = [dict(s) for s in samples]
        self.hardware_ = dict(hardware or {})
        self.overhead_points_ = [dict(p) for p in overhead_points]
        self.overheads_ = fit_overheads(self.overhead_points_)
        self.models_: dict[tuple[str, str], Any] = {}
        self.metrics_: dict[str, dict] = {}
        for kind in FEATURES:
            for target in TARGETS[kind]:
                x, y = _arrays(self.samples_, kind, target)
                if len(y) == 0:
                    continue
                self.models_[(kind, target)] = self._model(kind).fit(x, y)
                if len(y) >= 2 * self.folds and FORMS[kind] != "share":
                    predicted, measured = [], []
                    for train, test in KFold(self.folds, shuffle=True, random_state=self.seed).split(x):
                        model = self._model(kind).fit(x[train], y[train])
                        predicted.append(np.maximum(model.predict(x[test]), 1e-9))
                        measured.append(y[test])
                    predicted, measured = np.concatenate(predicted), np.concatenate(measured)
                    self.metrics_[f"{kind}.{target}"] = {
                        "samples": int(len(y)), "held_out_gmae": round(gmae(predicted, measured), 4),
                        "held_out_p95": round(float(np.percentile(relative_errors(predicted, measured), 95)), 4)}
                elif FORMS[kind] == "share":
                    self.metrics_[f"{kind}.{target}"] = {"samples": int(len(y)), "value": round(float(np.median(y)), 4),
                                                         "spread_iqr": round(float(np.subtract(*np.percentile(y, [75, 25]))), 4)}
        return self

    @property
    def kinds(self) -> set[str]:
        return {kind for kind, _ in self.models_}

    def predict(self, kind: str, features: Sequence[Sequence[float]] | np.ndarray, target: str = "ms") -> np.ndarray:
        """ms (or the share) of ``kind`` at each shape of ``features`` (N, F)."""
        if (kind, target) not in self.models_:
            raise NeuroShardError(f"the operator cost models have no '{kind}' {target} (measured kinds: "
                                  f"{', '.join(sorted(self.kinds)) or 'none'}); run `neuroshard collect dense`")
        x = np.asarray(features, dtype=np.float64).reshape(-1, len(FEATURES[kind]))
        return np.maximum(self.models_[(kind, target)].predict(x), 0.0)

    def one(self, kind: str, features: Sequence[float], target: str = "ms") -> float:
        return float(self.predict(kind, [features], target)[0])

    def with_overheads(self, durations: Sequence[Mapping[str, float]],
                       ranks: int | None = None) -> tuple[list[dict[str, float]], str]:
        """Each rank's term durations as real runs of the included runtime take them: per term,
        ``fixed + scale x duration``, fitted on real runs at the measured rank count nearest
        ``ranks`` (default: the ranks of ``durations``; ``fit_overheads``); and where they come
        from, in words. Without overheads, as given."""
        ranks = len(durations) if ranks is None else ranks
        if not any(t != ITERATION_KEY for t in self.overheads_):
            return [dict(d) for d in durations], "none (the operators alone: `neuroshard collect overheads` measures them)"
        out = [dict(d) for d in durations]
        counts = set()
        for term, per_ranks in self.overheads_.items():
            if term == ITERATION_KEY:
                continue
            nearest = _nearest_ranks(per_ranks, ranks)
            counts.add(nearest)
            fixed, scale = per_ranks[nearest]
            for row in out:
                if term in row:
                    row[term] = fixed + scale * row[term]
        measured = sorted({r for per in self.overheads_.values() for r in per})
        return out, (f"measured in {len({p.get('run') for p in self.overhead_points_})} real runs at "
                     f"{', '.join(map(str, measured))} ranks" + ("" if ranks in counts else
                                                                 f" (this plan's {ranks} ranks: not measured, "
                                                                 f"the nearest used)"))

    def with_period(self, period_ms: float, ranks: int) -> float:
        """The period real runs take for a critical path of ``period_ms`` on ``ranks`` ranks:
        ``fixed + scale x period`` fitted at the nearest measured rank count (``fit_overheads``),
        or the path itself without such points. On a machine with fewer cores than ranks the
        ranks take turns on the cores, which stretches the period beyond every term's own figure."""
        per_ranks = self.overheads_.get(ITERATION_KEY)
        if not per_ranks:
            return period_ms
        fixed, scale = per_ranks[_nearest_ranks(per_ranks, ranks)]
        return max(period_ms, fixed + scale * period_ms)

    # --------------------------------------------------------------- the file
    def to_dict(self) -> dict:
        return {"format": OPERATOR_COSTS_FORMAT, "hardware": self.hardware_, "params": self.get_params(),
                "metrics": self.metrics_, "overheads": {"fitted": {t: {str(r): list(v) for r, v in per.items()}
                                                                   for t, per in self.overheads_.items()},
                                                        "points": self.overhead_points_},
                "samples": self.samples_}

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=None, separators=(",", ":")) + "\n")

    @classmethod
    def from_dict(cls, data: Any, source: str = "operator costs") -> "OperatorModels":
        if not isinstance(data, Mapping) or data.get("format") != OPERATOR_COSTS_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise FormatError(f"{source}: not an operator-costs file (format {found!r}, expected "
                              f"{OPERATOR_COSTS_FORMAT!r}); `neuroshard collect dense` writes one")
        samples = data.get("samples")
        if not isinstance(samples, list) or not samples:
            raise FormatError(f"{source}: field 'samples' must be a non-empty list")
        for i, s in enumerate(samples):
            kind = s.get("kind") if isinstance(s, Mapping) else None
            if kind not in FEATURES:
                raise FormatError(f"{source}: samples[{i}]: unknown kind {kind!r}")
            feats = s.get("features")
            if not (isinstance(feats, list) and len(feats) == len(FEATURES[kind])
                    and all(isinstance(v, (int, float)) and np.isfinite(v) and v >= 0 for v in feats)):
                raise FormatError(f"{source}: samples[{i}]: field 'features' must be {len(FEATURES[kind])} "
                                  f"non-negative numbers ({', '.join(FEATURES[kind])})")
            needed = ("fwd_ms", "bwd_ms", "ms") if TARGETS[kind][0] == "fwd_ms" or kind == "embedding_split" else ("ms",)
            for key in needed:
                v = s.get(key)
                if not (isinstance(v, (int, float)) and np.isfinite(v) and v >= 0):
                    raise FormatError(f"{source}: samples[{i}]: field '{key}' must be a non-negative number of ms")
        params = data.get("params", {})
        if not isinstance(params, Mapping) or set(params) - set(cls().get_params()):
            raise FormatError(f"{source}: field 'params' must hold only {', '.join(cls().get_params())}")
        overheads = data.get("overheads") or {}
        points = overheads.get("points", []) if isinstance(overheads, Mapping) else None
        if not isinstance(points, list) or not all(
                isinstance(p, Mapping) and (p.get("term") in ITERATION_TERMS or p.get("term") == ITERATION_KEY)
                and is_int(p.get("ranks"))
                and all(isinstance(p.get(k), (int, float)) and np.isfinite(p[k]) and p[k] >= 0
                        for k in ("predicted_ms", "measured_ms")) for p in points):
            raise FormatError(f"{source}: field 'overheads.points' must list {{term, ranks, predicted_ms, "
                              f"measured_ms}} objects (terms of constants.ITERATION_TERMS)")
        return cls(**params).fit(samples, data.get("hardware"), points)

    @classmethod
    def read(cls, path: str | Path) -> "OperatorModels":
        return cls.from_dict(read_json(Path(path), "operator costs"), str(path))

    def format_metrics(self) -> str:
        """One line per kind and target: samples and held-out error."""
        lines = []
        for key, m in self.metrics_.items():
            if "held_out_gmae" in m:
                lines.append(f"  {key:28s} {m['samples']:4d} samples  held-out GMAE {100 * m['held_out_gmae']:5.1f}%"
                             f"  p95 {100 * m['held_out_p95']:5.1f}%")
            else:
                lines.append(f"  {key:28s} {m['samples']:4d} samples  {m['value']:.3f} (IQR {m['spread_iqr']:.3f})")
        return "\n".join(lines)


def fit_overheads(points: Sequence[Mapping]) -> dict[str, dict[int, tuple[float, float]]]:
    """Per term and rank count, ``(fixed ms, scale)`` with ``measured = fixed + scale x
    predicted`` over real runs' points (NNLS on relative error; a term predicted 0 everywhere,
    ``other_ms``, gets its median as ``fixed``). These are Lin et al.'s overheads on this
    runtime: what each term costs per step beyond its operators' isolated timings (dispatch
    and framework work around the dense operators, per-collective latency, data loading's
    host work, the bookkeeping between terms) and the slowdown of sharing cores with the
    other ranks."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for p in points:
        groups.setdefault((p["term"], int(p["ranks"])), []).append((float(p["predicted_ms"]), float(p["measured_ms"])))
    for (term, ranks), pairs in groups.items():
        pred, meas = np.array(pairs).T
        if len(pairs) < 3:
            continue
        if pred.max() <= 0:
            out.setdefault(term, {})[ranks] = (float(np.median(meas)), 0.0)
            continue
        weight = 1.0 / np.maximum(meas, 1e-3)
        coef, _ = nnls(np.column_stack([np.ones_like(pred), pred]) * weight[:, None], meas * weight)
        out.setdefault(term, {})[ranks] = (float(coef[0]), float(coef[1]))
    return out


#: the shipped operator models: this repository's CPU VM (``collect dense``, see its README)
SHIPPED_OPERATOR_COSTS = Path(__file__).resolve().parent.parent / "checkpoints" / "cpu-operators.json"


def load_operator_models(path: str | Path | None = None) -> OperatorModels:
    """The operator models of ``path``; with no path, this machine's own when it was pre-trained
    here (``neuroshard pretrain --here``), else the shipped ones."""
    if path is None:
        here = this_machine_file(MACHINE_OPERATORS_FILE)
        if here is not None:
            try:
                return OperatorModels.read(here)
            except NeuroShardError as exc:
                log.warning("ignoring this machine's operator costs %s (%s); rerun `neuroshard pretrain --here`",
                            here, exc)
    path = Path(path) if path is not None else SHIPPED_OPERATOR_COSTS
    if not path.exists():
        raise NeuroShardError(f"operator costs {path} not found; `neuroshard collect dense -o {path.name}` measures them")
    return OperatorModels.read(path)
