"""On-site calibration: correct the pre-trained compute model for this machine and these tables.

The shipped checkpoint is pre-trained on one machine over augmented tables; a user's
hardware and tables differ. ``calibrate`` measures this machine on the task's own
tables, in a few minutes:

1. every table alone (one shard set per table, whole tables; rows capped as in
   ``neuroshard measure``);
2. ``sets`` random device-sized sets drawn from the task: about tables / devices
   shards each (1 to 3x that), some tables halved by columns or cut into row
   blocks, as the search proposes them.

All are timed with ``neuroshard measure``'s protocol (``costmodels.samples.timing.time_devices``)
at the cost models' batch size, and described with the features the simulator gives
the same pieces, so the calibrated model predicts exactly what the search will ask.

**What is fitted.** By default the ensemble's two corrections (``costmodels.ensemble``), on
top of the pre-trained members: the shard correction (each table's own error, from the
tables timed alone; a row block or strip takes its table's) and the set-size correction
(this machine's level and how a set's cost grows with its number of shards). With ``fine_tune=True`` the
members' weights are fine-tuned on the measurements first (universal first, specific
second), as refine rounds do. Measured on held-out tasks (criteo-terabyte, criteo-kaggle,
dlrm-2021, 4 and 8 devices, one interleaved run each): both calibrations cut the error on
held-out random sets from 25-93% to 5-10%, but the fine-tuned model's plans were 1.00-1.05x
measured-greedy's where the corrected pre-trained model's were 0.78-0.98x: fine-tuned on a
few hundred sets, the model is wrong where the search goes, and the search goes there.

A quarter of the random sets is held out: the model's error on them before and after
is reported, and the pre-trained model is kept when calibration made it worse. The
calibrated models keep the pre-trained communication models and record the calibration
in ``hardware`` and ``metrics``.

``calibrated_models`` caches the result under ``$XDG_CACHE_HOME/neuroshard`` (default
``~/.cache/neuroshard``), keyed by the machine's fingerprint (the one that names its
pre-trained folder, ``costmodels.samples.store.machine_fingerprint``), the checkpoint, the tables
and the settings: ``neuroshard search --calibrate`` calibrates once per task and machine.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import CALIBRATION_SETS, DEFAULT_MAX_ROWS, MIN_CALIBRATION_SETS
from ..costmodels.base import CostModels
from ..costmodels.metrics import gmae
from ..costmodels.precision import model_precision
from ..costmodels.samples.kernel import llc_bytes
from ..costmodels.samples.store import fingerprint_id, machine_fingerprint
from ..costmodels.samples.timing import device_figures, time_devices
from ..errors import NeuroShardError
from ..search.simulator import Simulator
from ..tables import TableSet
from ..types import DeviceTimer, Piece
from ..validate import check_weights_precision
from .calibration_sets import RUN_LOOKUP_BYTES, random_sets, timed_within_budget

log = logging.getLogger(__name__)

DEFAULT_SETS = CALIBRATION_SETS
#: what a calibration does, in the cache key: 2 adds the set-size correction, 3 fits only it by
#: default (no fine-tuning), 4 adds the shard correction from the tables timed alone, 5 the work
#: model, so models cached by an earlier recipe are calibrated again rather than reused
CALIBRATION_RECIPE = 5
#: what the progress bar says while each kind of set is timed
TIMING_LABELS = {"table": "calibrate: each table alone", "random": "calibrate: random sets",
                 "plan": "refine: the plan's devices"}


@dataclass
class CalibrationReport:
    """What calibration measured and how much it helped (errors on held-out sets)."""

    tables: int
    sets_measured: int
    held_out: int
    gmae_before: float
    gmae_after: float
    seconds: float
    kept_pretrained: bool = False  # fine-tuning did not help on the held-out sets: the pre-trained model is used
    plan_sets: int = 0  # of sets_measured: devices of searched plans (``measured.refine``)

    def format(self) -> str:
        plans = f" + {self.plan_sets} devices of searched plans" if self.plan_sets else ""
        return (f"calibrated on {self.sets_measured} measured sets ({self.tables} tables alone + random device-sized "
                f"sets{plans}) in {self.seconds:.0f} s; compute GMAE on {self.held_out} held-out sets: "
                f"{100 * self.gmae_before:.1f}% before, {100 * self.gmae_after:.1f}% after"
                + ("; kept the pre-trained model" if self.kept_pretrained else ""))

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Calibration:
    """This machine's measurements of one task's shard sets, and the fine-tuning on them.

    ``add(sets, kind)`` times sets of pieces (``types.Piece``) with ``timer`` (the device
    timer, ``neuroshard measure``'s protocol) and keeps their features and times; ``fit()`` fine-tunes a
    copy of the pre-trained compute model on everything added so far. Sets of kind
    ``"random"`` provide the held-out sets (a quarter, fixed at the first fit) and the
    validation sets; the others (``"table"``: tables alone, ``"plan"``: the devices of
    searched plans, see ``measured.refine``) are always trained on."""

    def __init__(self, tables: TableSet, models: CostModels, seed: int = 0, row_cap: int = DEFAULT_MAX_ROWS,
                 kernel: str = "auto", epochs: int = 200, weights_precision: str = "fp32",
                 timer: DeviceTimer = time_devices, fine_tune: bool = False) -> None:
        if not hasattr(models.compute, "fine_tune"):
            raise NeuroShardError(f"calibration fine-tunes a neural compute model (or an ensemble of them); cost "
                                  f"models '{models.name}' have a {type(models.compute).__name__}")
        check_weights_precision(weights_precision)
        self.tables, self.models, self.row_cap, self.kernel = tables, models, row_cap, kernel
        self.epochs, self.weights_precision = epochs, weights_precision
        self.timer = timer  # real kernels on this machine; tests pass a fake (``types.DeviceTimer``)
        self.fine_tune = fine_tune  # False: the pre-trained members stay, only the set-size correction is fitted
        self.rng = np.random.default_rng(seed)
        self.sim = Simulator(tables.at_batch(models.batch_size), 1, models)
        self.sets: list[list] = []  # the measured sets of pieces, in the order of features and costs
        self.features: list[np.ndarray] = []
        self.costs: list[float] = []
        self.kinds: list[str] = []
        self.config: dict = {}
        self.seconds = 0.0
        self.held_out: tuple[np.ndarray, np.ndarray] | None = None  # (test, validation) set numbers, first fit
        self.report: CalibrationReport | None = None  # of the last fit
        self.budget: Any = None  # a ``measured.budget.Budget``: learns the timing rate, shows the progress
        self.timing_seconds, self.timed_units = 0.0, 0  # the timer's seconds and units (sets x (passes + 1))

    @property
    def fittable(self) -> bool:
        """Whether enough random sets are measured for ``fit`` (``MIN_CALIBRATION_SETS``)."""
        return self.kinds.count("random") >= MIN_CALIBRATION_SETS

    def time(self, sets: list, passes: int = 1, what: str = "timing device sets", repeats: int = 1) -> np.ndarray:
        """Time ``sets`` (lists of pieces; empty ones are skipped) on this machine in one
        interleaved run, each its figure over ``passes`` passes of ``repeats`` runs
        (``timing.device_figures``; ms); ``what`` labels the progress bar on a terminal."""
        start = time.perf_counter()
        shard_lists = [self.sim.to_shards(s, np.zeros(len(s), dtype=np.int64)) for s in sets if len(s)]
        if self.budget is not None:  # its progress line says what is timed (the timer's own bar stays off)
            self.budget.say(f"{what.split(': ', 1)[-1]} ({len(shard_lists)} sets)")
        times, self.config = self.timer(shard_lists, self.tables, passes=passes, repeats=repeats,
                                          batch_size=self.models.batch_size, row_cap=self.row_cap, kernel=self.kernel,
                                          progress=what if self.budget is None else False,
                                          weights_precision=self.weights_precision)
        took = time.perf_counter() - start
        self.seconds += took
        self.timing_seconds += took
        self.timed_units += len(shard_lists) * (passes + 1)
        if self.budget is not None:
            self.budget.timed(len(shard_lists), passes, took)
        return np.array(device_figures(times, self.config))

    def lookup_bytes(self, pieces: list) -> float:
        """The estimated bytes of one batch of a set's lookups (indices and their fused copy)."""
        batch = self.models.batch_size
        return sum(2 * 8 * batch * self.tables[p.table].pooling_factor * p.num_rows
                   / max(self.tables[p.table].num_embeddings, 1) for p in pieces)

    def add(self, sets: list, kind: str, passes: int = 1) -> np.ndarray:
        """``time`` the sets and keep them for ``fit``, in runs of at most ``RUN_LOOKUP_BYTES`` of
        lookups (a run holds every set's batch). Returns their times (ms)."""
        sets = [list(s) for s in sets if len(s)]
        runs, size = [[]], 0.0
        for pieces in sets:
            need = self.lookup_bytes(pieces)
            if runs[-1] and size + need > RUN_LOOKUP_BYTES:
                runs.append([])
                size = 0.0
            runs[-1].append(pieces)
            size += need
        label = TIMING_LABELS.get(kind, f"timing {kind} sets")
        costs = np.concatenate([self.time(run, passes, label) for run in runs if run] or [np.zeros(0)])
        self.sets += sets
        self.features += [self.sim.features_of(self.sim.piece_ids(s)) for s in sets]
        self.costs += costs.tolist()
        self.kinds += [kind] * len(sets)
        return costs

    def predict(self, sets: list, models: CostModels | None = None) -> np.ndarray:
        """The compute model's (default: the pre-trained one's) ms for sets of pieces."""
        return (models or self.models).compute.predict([self.sim.features_of(self.sim.piece_ids(s)) for s in sets])

    def fit(self, fine_tune: bool | None = None) -> tuple[CostModels, CalibrationReport]:
        """Calibrate a copy of the pre-trained compute model on every set added so far: fit
        its set-size correction (level and crowding) and, with ``fine_tune`` (default: the
        calibration's), first fine-tune its weights; keep the pre-trained one when the result
        is worse on the held-out sets."""
        fine_tune = self.fine_tune if fine_tune is None else fine_tune
        start = time.perf_counter()
        kinds = np.array(self.kinds)
        randoms = np.flatnonzero(kinds == "random")
        if len(randoms) < MIN_CALIBRATION_SETS:
            raise NeuroShardError(f"calibration needs at least {MIN_CALIBRATION_SETS} measured random sets, "
                                  f"got {len(randoms)}")
        if self.held_out is None:  # fixed at the first fit, so every refit is judged on the same sets
            order = randoms[self.rng.permutation(len(randoms))]
            test = order[:max(2, len(randoms) // 4)]
            self.held_out = (test, order[len(test):len(test) + max(2, len(randoms) // 8)])
        test, val = self.held_out
        train = np.setdiff1d(np.arange(len(self.features)), np.concatenate([test, val]))
        costs, features = np.array(self.costs), self.features
        before = gmae(self.models.compute.predict([features[i] for i in test]), costs[test])
        compute = copy.deepcopy(self.models.compute)
        if fine_tune:
            tuning = time.perf_counter()
            compute.fine_tune([features[i] for i in train], costs[train], [features[i] for i in val], costs[val],
                              epochs=self.epochs)
            if self.budget is not None:  # what the next round's fine-tuning is estimated by
                self.budget.fine_tune_s_per_set = (time.perf_counter() - tuning) / max(len(features), 1)
        singles = [i for i in train if len(features[i]) == 1]  # the tables alone, above all
        if singles and hasattr(compute, "fit_shard_correction"):  # each table's own error (``ensemble``)
            compute.fit_shard_correction(np.concatenate([features[i] for i in singles]), costs[singles],
                                         knee_bytes=llc_bytes(), row_cap=self.row_cap)
        if hasattr(compute, "fit_set_size_correction"):  # the crowding the pooled members miss (``ensemble``)
            compute.fit_set_size_correction([features[i] for i in train], costs[train])
        after = gmae(compute.predict([features[i] for i in test]), costs[test])
        kept = after > before  # fine-tuning made it worse on held-out sets (too few, too noisy): keep the pre-trained
        if kept:
            log.warning("calibration: the fine-tuned model is worse on the held-out sets (%.1f%% vs %.1f%%); keeping "
                        "the pre-trained model", 100 * after, 100 * before)
            compute = copy.deepcopy(self.models.compute)  # it predicts as pre-trained; the work model joins it
        # a second opinion: its plan is one more candidate (``ensemble``); not on a kept model of another
        # precision (the search scales that model's times to the timed precision, which the work model has)
        if hasattr(compute, "fit_work_model") and not (kept and model_precision(self.models) != self.weights_precision):
            compute.fit_work_model([features[i] for i in train], costs[train], self.row_cap)
        self.seconds += time.perf_counter() - start
        report = CalibrationReport(int((kinds == "table").sum()), len(features), len(test), before, after,
                                   self.seconds, kept, int((kinds == "plan").sum()))
        models = self.models
        calibrated = CostModels(compute, models.comm, models.batch_size,
                                hardware={**models.hardware, "calibrated_on": self.config["hardware"],
                                          "calibration_kernel": self.config["kernel"],
                                          # a kept pre-trained model still predicts its own precision
                                          "weights_precision": (model_precision(models) if kept
                                                                else self.weights_precision)},
                                name=f"{models.name}+calibrated:{self.tables.name}",
                                metrics={**models.metrics, "calibration": report.to_dict()},
                                data_summary=models.data_summary)
        log.info(report.format())
        self.report = report
        return calibrated, report


def start_calibration(tables: TableSet, models: CostModels, devices: int = 8, sets: int = DEFAULT_SETS,
                      seed: int = 0, budget: Any = None, **options: Any) -> Calibration:
    """A ``Calibration`` with the task's tables alone and ``sets`` random device-sized sets
    measured (``options``: ``Calibration``'s row_cap, kernel, epochs, weights_precision). With a
    bounded ``budget`` (``measured.budget.Budget``) the sets are timed in runs of
    ``calibration_chunk`` within ``calibration_share`` of it (``calibration_sets.timed_within_budget``):
    fewer random sets when they do not fit, none when fewer than ``MIN_CALIBRATION_SETS`` do
    (``Calibration.fittable`` then says so); the budget records what was skipped."""
    if not isinstance(sets, int) or isinstance(sets, bool) or sets < MIN_CALIBRATION_SETS:
        raise NeuroShardError(f"calibration needs at least {MIN_CALIBRATION_SETS} random sets, got {sets!r}")
    calibration = Calibration(tables, models, seed, **options)
    calibration.budget = budget
    singles = [[Piece(i, 0, t.num_embeddings, 0, t.embedding_dim)] for i, t in enumerate(tables)]
    if budget is not None and budget.bounded:
        with budget.stage("calibrate"):
            timed_within_budget(calibration, singles, devices, sets, budget)
        return calibration
    randoms = random_sets(tables, devices, sets, calibration.row_cap, calibration.rng)
    log.info("calibration: timing %d tables alone and %d random sets on this machine", len(singles), len(randoms))
    calibration.add(singles, "table")
    calibration.add(randoms, "random")
    return calibration


def calibrate(tables: TableSet, models: CostModels, devices: int = 8, sets: int = DEFAULT_SETS, seed: int = 0,
              **options: Any) -> tuple[CostModels, CalibrationReport]:
    """Measure ``tables`` on this machine and fine-tune ``models``' compute model (see the
    module docstring), the kernels timed with weights of ``options["weights_precision"]``
    (recorded: the calibrated model predicts that precision). Returns the calibrated
    models (a copy) and the report."""
    return start_calibration(tables, models, devices, sets, seed, **options).fit()


def _cache_key(tables: TableSet, models: CostModels, devices: int, sets: int, seed: int,
               weights_precision: str = "fp32") -> str:
    # this machine as its pre-trained folder names it (store.machine_fingerprint: the CPU by name, generation
    # and last-level cache, as cloud VMs give different Xeons one name; cores, torch, fbgemm): one identity.
    # A cache entry keyed otherwise is never found again: the task is calibrated anew
    payload = {"machine": fingerprint_id(machine_fingerprint("cpu")),
               "models": models.name, "models_path": str(getattr(models, "path", "") or ""),
               "tables": TableSet(tables.name, list(tables), tables.batch_size).to_dict(),
               "devices": devices, "sets": sets, "seed": seed, "recipe": CALIBRATION_RECIPE}
    if weights_precision != "fp32":  # fp32 entries keep the keys they had
        payload["weights_precision"] = weights_precision
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "neuroshard" / "calibrated"


def calibrated_models(tables: TableSet, models: CostModels, devices: int = 8, sets: int = DEFAULT_SETS,
                      seed: int = 0, **options: Any) -> CostModels:
    """``calibrate``, cached by hardware fingerprint, checkpoint, tables and settings."""
    key = _cache_key(tables, models, devices, sets, seed, options.get("weights_precision", "fp32"))
    path = cache_dir() / f"{key}.pt"
    if path.exists():
        try:
            cached = CostModels.load(path)
            log.info("calibrated models from the cache: %s", path)
            return cached
        except NeuroShardError as exc:
            log.warning("ignoring a broken calibration cache entry %s: %s", path, exc)
    calibrated, report = calibrate(tables, models, devices, sets, seed, **options)
    print(report.format())
    try:
        calibrated.save(path)
    except OSError as exc:
        log.warning("could not cache the calibrated models in %s: %s", path, exc)
    return calibrated
