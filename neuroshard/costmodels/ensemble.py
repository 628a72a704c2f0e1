"""An ensemble of neural compute models: a prediction and an honest spread.

A deep ensemble (Lakshminarayanan et al., 2017): ``size`` neural compute models with
the same recipe, each trained from another seed on a bootstrap resample of the sets.
Where the measurements cover a shard set the members agree; on sets unlike any they
were trained on they drift apart. ``predict`` is their geometric mean, ``spread``
the standard deviation of their log predictions (about the relative error one should
expect there).

The search uses the spread so that it does not exploit model error
(``Simulator(risk=)``): a device set is charged ``mean x exp(risk x spread)``, so a
plan wins only where it is better by more than the models disagree.

**Set-size correction** (``fit_set_size_correction``, fitted by on-site calibration):
the members pool per-shard encodings, and the pre-training data had few shards per set,
so they learnt the fused kernel's amortisation but not its crowding: measured on this
project's CPU, one device's cost per table falls to about 10 tables, then rises again
(``experiments/results/grouping_effect/count_curve.md``), while the model's keeps
falling. The correction multiplies the mean by ``exp(c . phi(n))``, ``n`` the shards of
the set, ``phi`` piecewise linear in ``log n`` (knots ``SET_SIZE_KNOTS``), ``c`` the
ridge least-squares fit of ``log(measured / predicted)`` on the calibration's sets.

**Work model** (``fit_work_model``, fitted by on-site calibration on every set it measured): a
``work.WorkComputeModel`` beside the members, linear in lookups x columns, shards and weight
bytes. It is not part of ``predict`` or the spread: on criteo-terabyte at 8 devices (seed 169)
the search against the calibrated members wrote a plan measured 1.12-1.20x the best baseline,
the same search against the work model alone 0.971x, but on dlrm-2021 (seed 171) 0.895x and
0.958x, and charging the work model's excess over the members as spread lost there (0.978x;
``docs/decisions.md#work-model``). Its plan is one more candidate that measurement
decides (``work_cost_models``; ``measured.refine`` and ``search --calibrate`` time it).

**Shard correction** (``fit_shard_correction``, fitted by on-site calibration on the task's
tables timed alone): the members' error differs from table to table far more than from set
to set. Measured on this project's AMD EPYC (criteo-terabyte, 144 tables, 16 devices), the
log error of tables alone has a standard deviation of 0.75 (hot 100-lookup tables predicted
2.7x too slow, small 3-lookup tables 1.5x too fast) against 0.28 for random device sets, so
a search trusting the members thinks a device holding one hot table costs as much as one
holding twelve small ones, and never cuts the hot table into row blocks. Each shard gets
the log error of the measured tables nearest to it in feature space (``KNeighborsRegressor``
over the standardised access features ``SHARD_MATCH``, ``SHARD_NEIGHBOURS`` of them, by
distance: a table's column strips take exactly its correction, its row blocks come nearest
to it), and a set is multiplied by the mean of its shards'
factors weighted by their predicted cost alone (``R``, a log). How much of ``R`` a set
carries is fitted with the set-size correction, as ``R`` times the same piecewise-linear
function of ``log n``: a table alone carries all of its error, a fused set of many small
tables little (alone, a small table's time is mostly the kernel call's own overhead, which
the fused set pays once). Measured effect: ``docs/results.md`` ("Tables timed alone correct the model").
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from ..errors import NeuroShardError
from .base import ComputeCostModel, CostModels, register_model
from .features import FEATURE_NAMES, capped_weight_bytes
from .neural import NeuralComputeModel
from .work import WorkComputeModel

#: shards per set where the set-size correction may bend (piecewise linear in log n between them)
SET_SIZE_KNOTS = (4.0, 16.0)
#: ridge penalty of the set-size correction's slopes (its level is not penalised)
SET_SIZE_RIDGE = 1e-2
#: measured tables whose errors a shard's correction averages (weighted by inverse distance)
SHARD_NEIGHBOURS = 3
#: the features a shard is matched on: how its rows are looked up, not its width or bytes, so that
#: a table's column strips match the table itself (and its row blocks come nearest to it)
SHARD_MATCH = tuple(i for i, name in enumerate(FEATURE_NAMES) if name not in ("dim", "log2_size_bytes"))


def set_size_basis(sizes: np.ndarray) -> np.ndarray:
    """(sets, 2 + knots): 1, log n, and a hinge max(0, log n - log k) per knot."""
    log_n = np.log(np.maximum(np.asarray(sizes, dtype=np.float64), 1.0))
    return np.column_stack([np.ones_like(log_n), log_n] + [np.maximum(0.0, log_n - np.log(k)) for k in SET_SIZE_KNOTS])


def working_set_log2(sets: Sequence[np.ndarray], knee_bytes: int, row_cap: int) -> np.ndarray:
    """Per set: log2 of its weights' bytes (rows capped at ``row_cap``, as measured) over
    ``knee_bytes``, 0 below it."""
    return np.array([max(0.0, np.log2(max(capped_weight_bytes(s, row_cap), 1.0) / knee_bytes)) for s in sets])


@register_model
class EnsembleComputeModel(ComputeCostModel):
    """``size`` ``NeuralComputeModel(**member_params)`` on bootstrap resamples (fitted: ``members_``)."""

    name = "ensemble"

    def __init__(self, size: int = 5, bootstrap: bool = True, seed: int = 0, member_params: dict | None = None):
        self.size = size
        self.bootstrap = bootstrap
        self.seed = seed
        self.member_params = member_params

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray] | None = None,
            val_costs_ms: np.ndarray | None = None) -> "EnsembleComputeModel":
        if not isinstance(self.size, int) or self.size < 2:
            raise NeuroShardError(f"an ensemble needs at least 2 members, got {self.size!r}")
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        params = dict(self.member_params or {})
        base_seed = int(params.pop("seed", self.seed))
        self.members_ = []
        for k in range(self.size):
            rng = np.random.default_rng([self.seed, k])
            rows = rng.integers(0, len(sets), len(sets)) if self.bootstrap else np.arange(len(sets))
            member = NeuralComputeModel(**params, seed=base_seed + k)
            self.members_.append(member.fit([sets[i] for i in rows], costs_ms[rows], val_sets, val_costs_ms))
        return self

    def fine_tune(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray],
                  val_costs_ms: np.ndarray, **kwargs: Any) -> "EnsembleComputeModel":
        """Fine-tune every member on the same new measurements (on-site calibration)."""
        self._check()
        self.set_size_coef_ = None  # the members change: corrections fitted before no longer apply
        self.shard_refs_ = None
        for member in self.members_:
            member.fine_tune(sets, costs_ms, val_sets, val_costs_ms, **kwargs)
        return self

    def fit_set_size_correction(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray) -> "EnsembleComputeModel":
        """Fit the set-size correction on measured sets (see the module docstring)."""
        self._check()
        self.set_size_coef_ = None
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        keep = costs_ms > 0
        sets = [s for s, k in zip(sets, keep) if k]
        residual = np.log(costs_ms[keep]) - self._members_logs(sets).mean(axis=0)
        basis = self._set_basis(sets)
        penalty = SET_SIZE_RIDGE * np.eye(basis.shape[1])
        penalty[0, 0] = 0.0  # the level, and (with a shard correction) the share of a table's error it keeps alone
        if getattr(self, "shard_refs_", None) is not None:  # the shard factor's column
            penalty[len(SET_SIZE_KNOTS) + 2, len(SET_SIZE_KNOTS) + 2] = 0.0
        coef = np.linalg.solve(basis.T @ basis + len(sets) * penalty, basis.T @ residual)
        self.set_size_coef_ = [float(c) for c in coef]
        return self

    def fit_set_head(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, knee_bytes: int, row_cap: int
                     ) -> "EnsembleComputeModel":
        """The set-level head pre-training fits (``costmodels.pretrain``, ``set_head=``): the
        set-size correction with a working-set term (the set's weights beyond ``knee_bytes``, the
        measuring machine's last-level cache, rows capped at ``row_cap`` as measured), without the
        shard correction (that one needs the task's own tables timed alone: calibration's). The
        members pool per-shard encodings and miss what a set does as a whole: crowding, and big
        tables evicting each other's rows (``docs/decisions.md#set-size-and-shard-corrections``)."""
        self.shard_refs_ = None
        self.working_set_ = {"knee_bytes": int(knee_bytes), "row_cap": int(row_cap), "without_shards": True}
        return self.fit_set_size_correction(sets, costs_ms)

    def _set_basis(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """The corrections' regressors of each set: ``set_size_basis`` of its size and, with a
        shard correction, the same times the set's shard factor (log): how much of its tables'
        own error a set of n shards carries (all of it alone, less as the kernel fuses more)."""
        basis = set_size_basis(np.array([len(s) for s in sets]))
        shard = self._shard_log_factors(sets)
        ws = getattr(self, "working_set_", None)
        if shard is None and not (ws and ws.get("without_shards")):
            return basis
        columns = [basis] if shard is None else [basis, basis * shard[:, None]]
        if ws:  # the set's weights beyond the cache: fused big tables evict each other's rows
            columns.append(working_set_log2(sets, ws["knee_bytes"], ws["row_cap"])[:, None])
        return np.hstack(columns)

    def fit_shard_correction(self, singles: np.ndarray, costs_ms: np.ndarray, knee_bytes: int | None = None,
                             row_cap: int | None = None) -> "EnsembleComputeModel":
        """Fit the shard correction on shards measured alone: ``singles`` (n, features), their
        measured ms (see the module docstring). Call before ``fit_set_size_correction``: the
        set-size correction is then fitted on top of it, with a working-set term when
        ``knee_bytes`` (the measuring machine's last-level cache) and ``row_cap`` (the rows a
        measured shard allocated) are given."""
        self._check()
        self.shard_refs_ = None
        self.working_set_ = ({"knee_bytes": int(knee_bytes), "row_cap": int(row_cap)}
                             if knee_bytes and row_cap else None)
        self.set_size_coef_ = None  # refitted on top of the shard correction (``fit_set_size_correction``)
        singles = np.asarray(singles, dtype=np.float64).reshape(len(costs_ms), -1)
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        keep = costs_ms > 0
        if keep.sum() < 1:
            return self
        singles, costs_ms = singles[keep], costs_ms[keep]
        base = self._members_logs([row[None] for row in singles]).mean(axis=0)
        self.shard_refs_ = singles.tolist()
        self.shard_residuals_ = (np.log(costs_ms) - base).tolist()
        self._neighbours = None
        return self

    def fit_work_model(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, row_cap: int) -> "EnsembleComputeModel":
        """Fit the work model (``work.WorkComputeModel``) on measured sets; ``row_cap``: the rows a
        measured shard allocated."""
        self.work_model_ = WorkComputeModel(row_cap).fit(sets, costs_ms)
        return self

    def predict_work(self, sets: Sequence[np.ndarray]) -> np.ndarray | None:
        """The work model's ms of each set (None without one)."""
        work = getattr(self, "work_model_", None)
        return None if work is None else work.predict(sets)

    def _shard_log_factors(self, sets: Sequence[np.ndarray]) -> np.ndarray | None:
        """log of each set's shard correction (None without one)."""
        if getattr(self, "shard_refs_", None) is None or not len(sets):
            return None
        if getattr(self, "_neighbours", None) is None:
            from sklearn.neighbors import KNeighborsRegressor
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler
            refs = np.asarray(self.shard_refs_, dtype=np.float64)[:, SHARD_MATCH]
            self._neighbours = make_pipeline(StandardScaler(), KNeighborsRegressor(
                n_neighbors=min(SHARD_NEIGHBOURS, len(refs)), weights="distance")).fit(refs, self.shard_residuals_)
            self._alone_cache: dict[bytes, tuple[float, float]] = {}
        rows = np.concatenate([np.asarray(s, dtype=np.float32).reshape(len(s), -1) for s in sets])
        keys = [r.tobytes() for r in rows]
        cache = self._alone_cache
        todo = list({k: i for i, k in enumerate(keys) if k not in cache}.values())
        if todo:
            new = rows[todo].astype(np.float64)
            alone = np.exp(self._members_logs([r[None] for r in new]).mean(axis=0))
            factor = np.exp(self._neighbours.predict(new[:, SHARD_MATCH]))
            cache.update((keys[i], (float(a), float(f))) for i, a, f in zip(todo, alone, factor))
        weight, factor = np.array([cache[k] for k in keys]).T
        owner = np.repeat(np.arange(len(sets)), [len(s) for s in sets])
        total = np.bincount(owner, weights=weight, minlength=len(sets))
        scaled = np.bincount(owner, weights=weight * factor, minlength=len(sets))
        return np.log(np.where(total > 0, scaled / np.maximum(total, 1e-12), 1.0))

    def _check(self) -> None:
        if not getattr(self, "members_", None):
            raise NeuroShardError("the ensemble compute model is not trained; call fit or load a checkpoint")

    def predict_members(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """(members, sets) predicted ms."""
        self._check()
        return np.stack([m.predict(sets) for m in self.members_])

    def _members_logs(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """(members, sets) log of the predicted ms; their mean over members is the uncorrected log mean."""
        return np.log(np.maximum(self.predict_members(sets), 1e-9))

    def predict_with_spread(self, sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(geometric-mean ms, standard deviation of the members' log ms) of each set."""
        logs = self._members_logs(sets)
        mean = logs.mean(axis=0)
        coef = getattr(self, "set_size_coef_", None)
        if coef is not None:  # ``_set_basis`` has the columns the coefficients were fitted on
            mean = mean + self._set_basis(sets) @ np.asarray(coef)
        return np.exp(mean), logs.std(axis=0)

    def predict(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[0]

    def spread(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        return self.predict_with_spread(sets)[1]

    def fitted_state(self) -> dict:
        if not getattr(self, "members_", None):
            return {}
        state = {"members": [m.state_dict() for m in self.members_]}
        if getattr(self, "set_size_coef_", None) is not None:  # absent in checkpoints without one
            state["set_size_coef"] = list(self.set_size_coef_)
        if getattr(self, "work_model_", None) is not None:  # absent in checkpoints without one
            state["work_model"] = self.work_model_.state_dict()
        if getattr(self, "shard_refs_", None) is not None:  # absent in checkpoints without one
            state["shard_correction"] = {"refs": self.shard_refs_, "residuals": self.shard_residuals_,
                                         "working_set": getattr(self, "working_set_", None)}
        elif getattr(self, "working_set_", None) and self.set_size_coef_ is not None:  # the set-level head's
            state["working_set"] = dict(self.working_set_)
        return state

    def load_fitted_state(self, state: dict) -> None:
        self.members_ = [NeuralComputeModel.from_state_dict(m) for m in state["members"]]
        coef = state.get("set_size_coef")
        shard = state.get("shard_correction")
        size = 2 + len(SET_SIZE_KNOTS)
        ws = state.get("working_set") if shard is None else shard.get("working_set")
        if shard is None and ws is not None and not (isinstance(ws, dict) and ws.get("without_shards")):
            raise ValueError("a working_set without a shard correction must be the set-level head's")
        expected = (size + (1 if ws else 0)) if shard is None else 2 * size + (1 if ws else 0)
        if coef is not None and len(coef) != expected:
            raise ValueError(f"set_size_coef has {len(coef)} values, expected {expected}")
        work = state.get("work_model")
        self.work_model_ = None if work is None else WorkComputeModel.from_state_dict(work)
        self.working_set_ = ws
        self.set_size_coef_ = None if coef is None else [float(c) for c in coef]
        if shard is not None and (len(shard.get("refs", ())) != len(shard.get("residuals", ())) or not shard["refs"]):
            raise ValueError("shard_correction needs as many residuals as reference shards, at least one")
        self.shard_refs_ = None if shard is None else [list(map(float, r)) for r in shard["refs"]]
        self.shard_residuals_ = None if shard is None else [float(r) for r in shard["residuals"]]
        self._neighbours = None
        if len(self.members_) != self.size:
            raise ValueError(f"{len(self.members_)} members stored for an ensemble of {self.size}")


def work_cost_models(models: CostModels) -> CostModels | None:
    """``models`` with the compute model replaced by its work model (``work.WorkComputeModel``),
    or None when the compute model has no fitted work model."""
    work = getattr(models.compute, "work_model_", None)
    if not isinstance(models.compute, EnsembleComputeModel) or work is None:
        return None
    return replace(models, compute=work, name=f"{models.name}+work")
