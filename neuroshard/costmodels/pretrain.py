"""Pre-training: measured cost data -> fitted models, a comparison table, a checkpoint.

Compute data is split **by table**: the source tables are divided into training and
test tables, a shard set whose tables are all test tables is held out, one whose
tables are all training tables is trained on, and sets that mix the two are set
aside (used by neither). The validation split for early stopping and tuning is made
the same way inside the training tables. Communication samples have no tables and
are split at random. Every model (neural, tree, analytic) is fitted on the same
training data and scored with the same metrics on the same held-out data.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import FormatError, NeuroShardError
from ..tables import Table
from ..validate import check_number, check_seed, is_number
from .analytic import AnalyticCommModel, AnalyticComputeModel
from .base import CommSamples, CostModels
from .ensemble import EnsembleComputeModel
from .features import FEATURE_SCHEMA_VERSION, table_features
from .metrics import gmae
from .neural import NeuralCommModel, NeuralComputeModel
from .samples.store import load_comm_data, load_compute_data, read_meta
from .tree import TreeCommModel, TreeComputeModel

log = logging.getLogger(__name__)

METRIC_COLUMNS = ("gmae", "mape", "kendall_tau", "pair_accuracy", "n")
#: fewest measured shard sets a model is trained on (a random split holds out a fifth)
MIN_SETS = 16
#: shards from which a held-out set counts as crowded in the set-level head's report
CROWDED_SET = 16


# -------------------------------------------------------------------- data
@dataclass
class ComputeData:
    """Measured shard sets: features per set, measured ms, source tables per set."""

    sets: list[np.ndarray]
    costs_ms: np.ndarray
    tables: list[frozenset]
    batch_size: int
    meta: dict = field(default_factory=dict)
    #: per set, the tables file it was measured on (its folder's ``meta.json``), when known
    groups: list[str] = field(default_factory=list)

    def subset(self, rows: Sequence[int]) -> "ComputeData":
        rows = list(rows)
        return ComputeData([self.sets[i] for i in rows], self.costs_ms[rows], [self.tables[i] for i in rows],
                           self.batch_size, self.meta, [self.groups[i] for i in rows] if self.groups else [])

    def __len__(self) -> int:
        return len(self.sets)


def _read_meta(folder: Path) -> dict:
    return read_meta(folder) or {}


def load_compute(folder: str | Path) -> ComputeData:
    """Read ``compute.jsonl`` (+ ``meta.json``) of a measured folder into features."""
    folder = Path(folder)
    records = load_compute_data(folder)
    if not records:
        raise NeuroShardError(f"{folder}: no measured shard sets (compute.jsonl missing or empty)")
    meta = _read_meta(folder)
    for record in records:
        _check_compute_record(record, f"{folder / 'compute.jsonl'}: sample {record['sample']}")
    batch_sizes = {int(r.get("batch_size", meta.get("batch_size", 0))) for r in records}
    if len(batch_sizes) != 1 or 0 in batch_sizes:
        raise NeuroShardError(f"{folder}: shard sets must share one known batch size, found {sorted(batch_sizes)}")
    batch_size = batch_sizes.pop()
    cache: dict[str, np.ndarray] = {}
    sets, costs, tables = [], [], []
    for i, record in enumerate(records):
        cost = float(record.get("cost_ms", float("nan")))
        if not np.isfinite(cost) or cost <= 0 or not record.get("shards"):
            continue
        rows = []
        for shard in record["shards"]:
            key = json.dumps(shard, sort_keys=True)
            if key not in cache:
                table = Table.from_dict({k: v for k, v in shard.items() if k != "source_table"},
                                        where=f"{folder}/compute.jsonl line {i + 1}")
                cache[key] = table_features(table, batch_size)
            rows.append(cache[key])
        sets.append(np.stack(rows))
        costs.append(cost)
        tables.append(frozenset(s.get("source_table", s["name"]) for s in record["shards"]))
    log.info("%s: %d shard sets over %d source tables", folder, len(sets), len(set().union(*tables)))
    return ComputeData(sets, np.asarray(costs), tables, batch_size, meta)


def _check_compute_record(record: dict, where: str) -> None:
    """FormatError naming the file, sample and field of a malformed compute record."""
    if "batch_size" in record and not (isinstance(record["batch_size"], int) and not isinstance(record["batch_size"], bool)
                                       and 1 <= record["batch_size"] <= 2**20):
        raise FormatError(f"{where}: field 'batch_size' must be an integer in [1, {2**20}], got {record['batch_size']!r}")
    if not is_number(record.get("cost_ms")):
        raise FormatError(f"{where}: field 'cost_ms' must be a number, got {record.get('cost_ms')!r}")
    shards = record.get("shards")
    if not isinstance(shards, list) or not all(isinstance(x, dict) for x in shards):
        raise FormatError(f"{where}: field 'shards' must be a list of tables")
    for x in shards:
        if "source_table" in x and not isinstance(x["source_table"], str):
            raise FormatError(f"{where}: field 'shards[].source_table' must be a table name, got {x['source_table']!r}")
        if not isinstance(x.get("name"), str):
            raise FormatError(f"{where}: field 'shards[].name' must be a table name, got {x.get('name')!r}")


def _check_comm_record(record: dict, where: str) -> None:
    d = record.get("num_devices")
    if not (isinstance(d, int) and not isinstance(d, bool) and 2 <= d <= 1024):
        raise FormatError(f"{where}: field 'num_devices' must be an integer in [2, 1024], got {d!r}")
    if not (isinstance(record.get("batch_size"), int) and not isinstance(record.get("batch_size"), bool)):
        raise FormatError(f"{where}: field 'batch_size' must be an integer, got {record.get('batch_size')!r}")
    for key in ("widths", "fwd_ms", "bwd_ms") + tuple(k for k in ("skews_ms", "reduce_ms") if k in record):
        value = record.get(key)
        if not (isinstance(value, list) and len(value) == d and all(is_number(v) for v in value)):
            raise FormatError(f"{where}: field '{key}' must be a list of {d} numbers")
    if "reduce_width" in record and not is_number(record["reduce_width"]):
        raise FormatError(f"{where}: field 'reduce_width' must be a number, got {record['reduce_width']!r}")


def load_compute_folders(folders: Sequence[str | Path]) -> ComputeData:
    """Measured shard sets of several folders (the same hardware, kernel and batch size) as one."""
    parts = [load_compute(f) for f in folders]
    first = parts[0]
    for folder, part in zip(folders[1:], parts[1:]):
        for key in ("hardware", "software"):
            if part.meta.get(key) != first.meta.get(key):
                raise NeuroShardError(f"{folder}: measured on other {key} than {folders[0]}; "
                                      f"pre-train one checkpoint per machine")
        settings = [(p.batch_size, p.meta.get("config", {}).get("kernel"),
                     p.meta.get("config", {}).get("weights_precision", "fp32")) for p in (part, first)]
        if settings[0] != settings[1]:
            raise NeuroShardError(f"{folder}: batch size, kernel or weights precision differs from {folders[0]}")
    groups = [str(p.meta.get("config", {}).get("tables") or folder) for folder, p in zip(folders, parts)]
    return ComputeData([s for p in parts for s in p.sets], np.concatenate([p.costs_ms for p in parts]),
                       [t for p in parts for t in p.tables], first.batch_size, first.meta,
                       [g for g, p in zip(groups, parts) for _ in p.sets])


def load_comm(folders: Sequence[str | Path]) -> tuple[list[CommSamples], dict]:
    """Read ``comm.jsonl`` of each folder; one ``CommSamples`` group per device count, and the
    first folder's ``meta.json`` with the samples' ``batch_size`` added."""
    by_devices: dict[int, list[dict]] = {}
    meta: dict = {}
    for folder in map(Path, folders):
        records = load_comm_data(folder)
        if not records:
            raise NeuroShardError(f"{folder}: no communication samples (comm.jsonl missing or empty)")
        meta = meta or _read_meta(folder)
        for r in records:
            _check_comm_record(r, f"{folder / 'comm.jsonl'}: sample {r['sample']}")
            by_devices.setdefault(int(r["num_devices"]), []).append(r)
    batch_sizes = {int(r.get("batch_size", 0)) for rs in by_devices.values() for r in rs}
    if len(batch_sizes) != 1 or 0 in batch_sizes:
        raise NeuroShardError(f"communication samples must share one known batch size, found {sorted(batch_sizes)}")
    meta = {**meta, "batch_size": batch_sizes.pop()}
    groups = []
    for d, records in sorted(by_devices.items()):
        records = [r for r in records if min(r["fwd_ms"]) > 0 and min(r["bwd_ms"]) > 0]
        groups.append(CommSamples(
            widths=[r["widths"] for r in records], skews_ms=[r.get("skews_ms", [0.0] * d) for r in records],
            fwd_ms=[r["fwd_ms"] for r in records], bwd_ms=[r["bwd_ms"] for r in records],
            reduce_width=[r.get("reduce_width", 0) for r in records],
            reduce_ms=[r.get("reduce_ms", [np.nan] * d) for r in records]))
    return groups, meta


def split_by_table(tables: Sequence[frozenset], test_fraction: float, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train rows, test rows, mixed rows): test rows use only test tables, train rows only the others."""
    names = sorted(set().union(*tables))
    rng = np.random.default_rng(seed)
    test_tables = set(rng.choice(names, size=max(1, int(round(len(names) * test_fraction))), replace=False))
    kind = np.array([2 if t <= test_tables else (0 if not (t & test_tables) else 1) for t in tables])
    return np.flatnonzero(kind == 0), np.flatnonzero(kind == 2), np.flatnonzero(kind == 1)


def split_by_group(tables: Sequence[frozenset], groups: Sequence[str], test_fraction: float, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train rows, test rows, mixed rows) holding out whole groups of sets (``ComputeData.groups``:
    the tables file a set was measured on, e.g. one family). Sets of many shards draw a random
    table share into nearly every set, so ``split_by_table`` holds out nothing; here the held-out
    groups' sets are the test rows, the sets sharing none of their tables the training rows, and
    the rest (sets of other groups that reuse a held-out table) are left out of both. Groups are
    taken in a seeded order until the test rows reach ``test_fraction`` of the sets, skipping a
    group that would leave fewer training than test rows."""
    groups = np.asarray(groups)
    test: list[str] = []
    rows = (np.arange(len(tables)), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    for name in np.random.default_rng(seed).permutation(sorted(set(groups.tolist()))):
        held = np.isin(groups, [*test, name])
        held_tables = frozenset().union(*(tables[i] for i in np.flatnonzero(held)))
        train = np.array([not h and not (t & held_tables) for h, t in zip(held, tables)], dtype=bool)
        if train.sum() <= held.sum():
            continue
        test.append(str(name))
        rows = (np.flatnonzero(train), np.flatnonzero(held), np.flatnonzero(~train & ~held))
        if held.mean() >= test_fraction:
            break
    return rows


def table_folds(tables: Sequence[frozenset], folds: int, seed: int
                ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """K-fold by table: the source tables are partitioned into ``folds`` groups; fold k holds out
    the sets made only of group k's tables, trains on the sets with none of them. A set is held
    out in at most one fold."""
    names = np.array(sorted(set().union(*tables)))
    group = dict(zip(np.random.default_rng(seed).permutation(names), np.arange(len(names)) % folds))
    out = []
    for k in range(folds):
        held = set(name for name, g in group.items() if g == k)
        kind = np.array([2 if t <= held else (0 if not (t & held) else 1) for t in tables])
        out.append((np.flatnonzero(kind == 0), np.flatnonzero(kind == 2), np.flatnonzero(kind == 1)))
    return out


def split_comm(groups: Sequence[CommSamples], test_fraction: float, seed: int
               ) -> tuple[list[CommSamples], list[CommSamples]]:
    rng = np.random.default_rng(seed)
    train, test = [], []
    for g in groups:
        order = rng.permutation(len(g))
        cut = max(1, int(round(len(g) * test_fraction)))
        test.append(g.subset(order[:cut]))
        train.append(g.subset(order[cut:]))
    return train, test


# --------------------------------------------------------------- training
def tune_compute(train: ComputeData, val: ComputeData, trials: int, epochs: int, seed: int) -> dict:
    """Optuna search over width, depth, learning rate and weight decay; best hyper-parameters."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(trial: "optuna.Trial") -> float:
        model = NeuralComputeModel(hidden=trial.suggest_categorical("hidden", [64, 128, 256]),
                                   depth=trial.suggest_int("depth", 2, 4),
                                   lr=trial.suggest_float("lr", 3e-4, 1e-2, log=True),
                                   weight_decay=trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
                                   batch_size=trial.suggest_categorical("batch_size", [32, 64, 128]),
                                   epochs=epochs, seed=seed)
        model.fit(train.sets, train.costs_ms, val.sets, val.costs_ms)
        return model.val_loss_

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=trials)
    log.info("best of %d trials: val loss %.4f with %s", trials, study.best_value, study.best_params)
    return dict(study.best_params)


@dataclass
class PretrainResult:
    models: CostModels
    table: "object"              # pandas DataFrame: one row per (target, model)
    compute_models: dict
    comm_models: dict
    compute_test: ComputeData | None
    comm_test: list[CommSamples]


def refit_neural_compute(data: ComputeData, hparams: dict) -> NeuralComputeModel:
    """The same recipe on every measured set (validation: a random share), for shipping."""
    return NeuralComputeModel(**hparams).fit(data.sets, data.costs_ms)


def fit_compute_models(data: ComputeData, train_rows: np.ndarray, epochs: int, tune: int, seed: int
                       ) -> tuple[dict, dict]:
    """Fit neural, tree and analytic compute models on the sets ``train_rows``; (models, summary).
    The neural model validates (early stopping, tuning) on a random seventh of them: a split by
    table here would set aside most of the sets again (those mixing validation and fit tables)."""
    train = data.subset(train_rows)
    order = np.random.default_rng(seed).permutation(len(train))
    cut = max(10, len(train) // 7)
    fit, val = train.subset(order[cut:]), train.subset(order[:cut])
    params = tune_compute(fit, val, tune, epochs, seed) if tune > 0 else {}
    started = time.perf_counter()
    neural = NeuralComputeModel(epochs=epochs, seed=seed, **params).fit(fit.sets, fit.costs_ms, val.sets, val.costs_ms)
    log.info("neural compute model trained in %.1f s", time.perf_counter() - started)
    models = {"neural": neural, "tree": TreeComputeModel(seed=seed).fit(train.sets, train.costs_ms),
              "analytic": AnalyticComputeModel(data.batch_size).fit(train.sets, train.costs_ms)}
    summary = {"train_sets": len(fit), "val_sets": len(val), "hparams": dict(neural.hparams)}
    return models, summary


def fit_comm_models(train: list[CommSamples], batch_size: int, epochs: int, seed: int) -> dict:
    """Fit neural, tree and analytic communication models on the same samples."""
    return {"neural": NeuralCommModel(batch_size, epochs=epochs, seed=seed).fit(train),
            "tree": TreeCommModel(batch_size, seed=seed).fit(train),
            "analytic": AnalyticCommModel(batch_size).fit(train)}


def data_summary(data: ComputeData, test_rows: np.ndarray, mixed_rows: np.ndarray) -> dict:
    test_sets = [data.sets[i] for i in test_rows]
    return {"shard_sets": len(data), "source_tables": len(set().union(*data.tables)), "test_sets": len(test_rows),
            "mixed_sets_set_aside": int(len(mixed_rows)),
            "shards_per_set_mean": float(np.mean([len(s) for s in data.sets])),
            "test_shards_per_set_mean": float(np.mean([len(s) for s in test_sets])) if test_sets else 0.0,
            "cost_ms_range": [float(data.costs_ms.min()), float(data.costs_ms.max())]}


def comparison_table(compute_models: dict, compute_test: ComputeData | None, comm_models: dict,
                     comm_test: list[CommSamples], seed: int = 0):
    """pandas DataFrame, one row per (target, model), the same metrics for every model."""
    import pandas as pd
    rows = []
    if compute_test is not None:
        for name, model in compute_models.items():
            rows.append({"target": "compute", "model": name,
                         **model.evaluate(compute_test.sets, compute_test.costs_ms, seed=seed)})
    for name, model in comm_models.items():
        for direction, metrics in model.evaluate(comm_test, seed=seed).items():
            if np.isfinite(metrics["gmae"]):
                rows.append({"target": f"comm_{direction}", "model": name, **metrics})
    return pd.DataFrame(rows, columns=["target", "model", *METRIC_COLUMNS])


def format_table(table) -> str:
    shown = table.copy()
    for col in ("gmae", "mape", "pair_accuracy"):
        shown[col] = shown[col].map(lambda v: f"{100 * v:.2f}%")
    shown["kendall_tau"] = shown["kendall_tau"].map(lambda v: f"{v:.3f}")
    return shown.to_string(index=False)


def parity_plot(path: Path, compute_models: dict, compute_test: ComputeData | None, comm_models: dict,
                comm_test: list[CommSamples]) -> Path:
    """Predicted vs measured ms (log axes) for every model on the held-out data."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = ([("compute (held-out tables)", lambda m: m.predict(compute_test.sets), compute_test.costs_ms,
                compute_models)] if compute_test is not None else [])
    if comm_test:
        fwd_true = np.concatenate([g.fwd_ms.ravel() for g in comm_test])
        bwd_true = np.concatenate([g.bwd_ms.ravel() for g in comm_test])
        panels += [("all-to-all forward", lambda m: np.concatenate(
                        [m.predict_forward(g.widths, g.skews_ms).ravel() for g in comm_test]), fwd_true, comm_models),
                   ("all-to-all backward", lambda m: np.concatenate(
                        [m.predict_backward(g.widths).ravel() for g in comm_test]), bwd_true, comm_models)]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5 * max(len(panels), 1), 4.6), squeeze=False)
    for ax, (title, predict, true, models) in zip(axes[0], panels):
        for (name, model), marker in zip(models.items(), "o^s"):
            ax.scatter(true, predict(model), s=8, alpha=0.5, marker=marker, label=name)
        lo, hi = float(np.min(true)) * 0.7, float(np.max(true)) * 1.4
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms",
               ylabel="predicted ms", title=title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def held_out_set_head(compute: ComputeData, train_rows: np.ndarray, test_rows: np.ndarray, ensemble: int,
                      hparams: dict, set_head: tuple[int, int], trained: EnsembleComputeModel | None = None) -> dict:
    """The set-level head judged on tables held out: an ensemble of the training tables (``trained``
    when given) with and without the head fitted on the same tables, their GMAE on the held-out
    sets, all of them and the crowded ones (``CROWDED_SET`` shards or more), and whether the head is
    kept (it lowers the held-out GMAE)."""
    train, test = compute.subset(train_rows), compute.subset(test_rows)
    if len(test) < 5:
        return {"kept": False, "why": f"{len(test)} held-out sets: too few to judge the head"}
    model = trained or EnsembleComputeModel(ensemble, member_params=hparams).fit(train.sets, train.costs_ms)
    crowded = np.array([len(s) >= CROWDED_SET for s in test.sets])

    def errors(m: EnsembleComputeModel) -> tuple[float, float]:  # (all held-out sets, the crowded ones)
        predicted = m.predict(test.sets)
        return gmae(predicted, test.costs_ms), (gmae(predicted[crowded], test.costs_ms[crowded])
                                                if crowded.sum() >= 3 else math.nan)
    before, before_crowded = errors(model)
    after, after_crowded = errors(copy.deepcopy(model).fit_set_head(train.sets, train.costs_ms, *set_head))
    return {"kept": bool(after < before), "held_out_sets": len(test), "gmae_without": float(before),
            "gmae_with": float(after), "crowded_sets": int(crowded.sum()), "crowded_gmae_without": float(before_crowded),
            "crowded_gmae_with": float(after_crowded), "knee_bytes": int(set_head[0]), "row_cap": int(set_head[1])}


def pretrain(data: str | Path | Sequence[str | Path], comm_data: Sequence[str | Path] = (), out: str | Path | None = None,
             tune: int = 0, epochs: int = 400, test_tables: float = 0.25, seed: int = 0,
             refit: bool = True, ensemble: int = 0, set_head: tuple[int, int] | None = None) -> PretrainResult:
    """Fit and compare all models on the held-out split; with ``out``, save the neural bundle (with
    ``refit``, the same recipe retrained on all data: the metrics stay those of the held-out
    evaluation) and a parity plot beside it. ``ensemble`` >= 2 also fits that many neural models
    on bootstrap resamples (``EnsembleComputeModel``) and ships them as the compute model.
    ``set_head=(knee_bytes, row_cap)`` (with ``ensemble``; the measuring machine's last-level
    cache and the rows a measured shard allocated) also fits the set-level head
    (``EnsembleComputeModel.fit_set_head``), judged on the held-out tables by an ensemble of the
    training tables (``held_out_set_head``), and ships it only where it lowers the held-out error."""
    folders = [data] if isinstance(data, (str, Path)) else list(data)
    compute = load_compute_folders(folders)
    check_number(test_tables, "test_tables (share of tables held out)", 0.0, 1.0, low_open=True)
    check_seed(seed)
    if not (isinstance(ensemble, int) and (ensemble == 0 or 2 <= ensemble <= 64)):
        raise NeuroShardError(f"ensemble must be 0 (one model) or 2 to 64 members, got {ensemble!r}")
    train_rows, test_rows, mixed_rows = split_by_table(compute.tables, test_tables, seed)
    split = "by table"
    if len(test_rows) < 10 or len(train_rows) < 20:  # sets of many shards: hold out whole groups of tables
        train_rows, test_rows, mixed_rows = split_by_group(compute.tables, compute.groups or [""] * len(compute),
                                                           test_tables, seed)
        split = "by tables file (no table of a held-out set is in a training set)"
    if len(test_rows) < 10 or len(train_rows) < 20:
        if len(compute) < MIN_SETS:
            raise NeuroShardError(f"too few shard sets to train a model: {len(compute)} measured, at least "
                                  f"{MIN_SETS} needed; measure more")
        # Too few for held-out tables: hold out random sets instead, and say the metrics flatter the model.
        log.warning("too few shard sets for a split by table (%d train, %d held out of %d measured): held-out "
                    "metrics use a random split by shard set instead, which includes tables seen in training; "
                    "measure more for a split by table", len(train_rows), len(test_rows), len(compute))
        order = np.random.default_rng(seed).permutation(len(compute))
        cut = max(3, int(round(len(compute) * 0.2)))
        test_rows, train_rows, mixed_rows = np.sort(order[:cut]), np.sort(order[cut:]), np.zeros(0, dtype=np.int64)
        split = "random by shard set (too few sets for a split by table)"
    compute_models, fit_summary = fit_compute_models(compute, train_rows, epochs, tune, seed)
    compute_test = compute.subset(test_rows)
    compute_summary = {**data_summary(compute, test_rows, mixed_rows), **fit_summary, "test_tables_fraction": test_tables,
                       "split": split}
    comm_models: dict = {}
    comm_test: list[CommSamples] = []
    comm_summary: dict = {}
    if comm_data:
        groups, comm_meta = load_comm(comm_data)
        comm_train, comm_test = split_comm(groups, 0.2, seed)
        comm_models = fit_comm_models(comm_train, comm_meta["batch_size"], epochs, seed)
        comm_summary = {"samples": {str(g.num_devices): len(g) for g in groups},
                        "test_samples": {str(g.num_devices): len(g) for g in comm_test}}
    else:
        log.warning("no communication data given: the checkpoint carries the unfitted analytic comm model")
    table = comparison_table(compute_models, compute_test, comm_models, comm_test, seed)
    metrics = {f"{r.target}/{r.model}": {c: getattr(r, c) for c in METRIC_COLUMNS} for r in table.itertuples()}
    shipped_compute, shipped_comm = compute_models["neural"], comm_models.get("neural")
    if ensemble:  # the evaluated recipe, K times on bootstrap resamples (of all sets, or the training sets)
        data = compute if refit else compute.subset(train_rows)
        shipped_compute = EnsembleComputeModel(ensemble, member_params=compute_models["neural"].hparams).fit(
            data.sets, data.costs_ms)
        if set_head is not None:
            head = held_out_set_head(compute, train_rows, test_rows, ensemble, compute_models["neural"].hparams,
                                     set_head, None if refit else shipped_compute)
            compute_summary["set_head"] = head
            if head["kept"]:
                shipped_compute.fit_set_head(data.sets, data.costs_ms, *set_head)
    elif refit:  # the evaluated recipe, trained again on every table and sample
        log.info("refitting the neural models on all measured data")
        shipped_compute = refit_neural_compute(compute, compute_models["neural"].hparams)
    if refit and comm_data:
        shipped_comm = NeuralCommModel(comm_meta["batch_size"], epochs=epochs, seed=seed).fit(groups)
    compute_summary["shipped_model_trained_on"] = "all measured sets" if refit else "training tables only"
    if ensemble:
        compute_summary["shipped_model"] = (f"an ensemble of {ensemble} neural models (bootstrap resamples); the "
                                            f"held-out rows are one such model's")
    bundle = CostModels(compute=shipped_compute,
                        comm=shipped_comm or AnalyticCommModel(compute.batch_size),
                        batch_size=compute.batch_size, hardware=compute.meta,
                        name=Path(out).stem if out else "pretrained", metrics=metrics,
                        data_summary={"compute": compute_summary, "comm": comm_summary, "data": [str(f) for f in folders],
                                      "comm_data": [str(c) for c in comm_data],
                                      "feature_schema_version": FEATURE_SCHEMA_VERSION})
    if out is not None:
        out = Path(out)
        bundle.save(out)
        parity_plot(out.with_suffix(".parity.png"), compute_models, compute_test, comm_models, comm_test)
    return PretrainResult(bundle, table, compute_models, comm_models, compute_test, comm_test)
