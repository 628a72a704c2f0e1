"""The stages of one ``neuroshard pretrain --here`` run, in order (``MachineRun``).

Each stage skips what is up to date in the machine's folder, records the seconds it spent in
``machine.json`` (``read_state``, ``write_state``) and updates the progress line: ``compute``
and ``comm`` collect in their shares of the budget, ``fit`` fits the cost models
(``machine_report.fit_models``), ``dense`` times the operators of a training step,
``overheads`` prices real runs, and ``finish`` writes the report
(``machine_report.format_report``).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..costmodels.base import CostModels
from ..costmodels.dense import OperatorModels
from ..costmodels.samples import store
from ..costmodels.samples.dense import PARTS as DENSE_PARTS
from ..costmodels.samples.dense import collect_dense
from ..errors import NeuroShardError
from ..io import atomic_write_text
from ..validate import read_json
from .collect import collect_comm, collect_compute
from .machine_profiles import (CEILING_COMM_SAMPLES, CEILING_COMPUTE_SETS, MIN_COMM_SAMPLES, MIN_COMPUTE_SETS,
                               SHARES, Profile, choose_overhead_configs, comm_device_counts, dense_size,
                               machine_pace, overhead_runs, split_count, write_pools)
from .machine_report import fit_models, format_report
from .progress import Progress

log = logging.getLogger(__name__)

STATE_FILE = "machine.json"
STATE_FORMAT = "neuroshard.machine/v1"


# ------------------------------------------------------------------ progress
class _ShareSpent(logging.Filter):
    """Drops collect's "time limit reached ...; rerun to continue": here a collection stops when
    its share of the budget is spent, as planned (the closing progress line says how many)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "time limit reached" not in record.getMessage()


class _Watch:
    """Counts the records a collection appends to ``path`` (from a thread, every second) and
    hands the count to ``on_count``: the collection loop itself is left alone."""

    def __init__(self, path: Path, on_count: Callable[[int], None], initial: int) -> None:
        self.path, self.on_count, self.count = path, on_count, initial
        self._offset = path.stat().st_size if path.exists() else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pretrain-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.poll()

    def poll(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size > self._offset:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                self.count += handle.read(size - self._offset).count(b"\n")
            self._offset = size
            self.on_count(self.count)

    def __enter__(self) -> "_Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()


# --------------------------------------------------------------------- state
def read_state(folder: Path) -> dict:
    """``machine.json``: the fingerprint, the seconds each stage spent, what each fitted output
    was made from; an empty state for a new folder."""
    path = folder / STATE_FILE
    if not path.exists():
        return {"format": STATE_FORMAT, "spent_s": {}}
    state = read_json(path, "machine state")
    if not (isinstance(state, dict) and state.get("format") == STATE_FORMAT):
        raise NeuroShardError(f"{path}: not a machine state ({STATE_FORMAT}); move the folder away to start again")
    state.setdefault("spent_s", {})
    return state


def write_state(folder: Path, state: dict) -> None:
    atomic_write_text(folder / STATE_FILE, json.dumps(state, indent=1, default=str) + "\n")


# -------------------------------------------------------------------- result
@dataclass
class HereResult:
    """What ``pretrain_here`` did: the machine's folder, what each stage measured now and in all,
    and each stage's seconds this run."""

    folder: Path
    fingerprint: dict
    measured_now: dict = field(default_factory=dict)   # stage -> samples timed in this run
    in_all: dict = field(default_factory=dict)         # stage -> samples on disk
    seconds: dict = field(default_factory=dict)        # stage -> seconds this run
    skipped: list = field(default_factory=list)        # stages up to date, not run
    pace: dict = field(default_factory=dict)           # stage -> machine_pace() when it was sized
    report: str = ""


OverheadsFn = Callable[..., OperatorModels]


class MachineRun:
    """One run of ``pretrain_here``: the machine's folder and state, the budget, and a method
    per stage (each skips what is up to date and records the seconds it spent)."""

    def __init__(self, folder: Path, fingerprint: dict, profile: Profile, minutes: float, backend: str,
                 progress: str) -> None:
        self.folder, self.profile, self.minutes, self.backend = folder, profile, minutes, backend
        self.started = time.monotonic()
        self.deadline = self.started + 60.0 * minutes
        self.bar = Progress(progress, prefix="pretrain --here")
        self.bar.deadline = self.deadline  # the time left is the run's
        folder.mkdir(parents=True, exist_ok=True)
        self.state = read_state(folder)
        recorded = self.state.get("fingerprint")
        if recorded is not None and store.fingerprint_id(recorded) != folder.name:
            raise NeuroShardError(f"{folder / STATE_FILE} records another machine's fingerprint; move the folder "
                                  f"away")
        self.state.update(fingerprint=fingerprint, id=folder.name)
        write_state(folder, self.state)
        self.data = folder / "data" / profile.name
        self.tables = self.data / "tables"
        write_pools(self.tables, profile)
        self.result = HereResult(folder, fingerprint)

    def say(self, text: str) -> None:
        """A line of its own (nothing when quiet)."""
        self.bar.note(text)

    def share(self, stage: str) -> float:
        """The stage's share of the budget, in seconds."""
        return 60.0 * self.minutes * SHARES[stage]

    def spend(self, key: str, seconds: float) -> None:
        self.state["spent_s"][key] = round(float(self.state["spent_s"].get(key, 0.0)) + seconds, 3)
        write_state(self.folder, self.state)

    def compute(self, compute_sets: int | None) -> list[Path]:
        """Stage 1: every collection of the profile, in its share of the compute share."""
        collections = self.profile.collections
        weights = [c.weight for c in collections]
        targets = (split_count(compute_sets, weights) if compute_sets is not None
                   else [CEILING_COMPUTE_SETS] * len(collections))
        started, measured, folders = time.monotonic(), 0, []
        for collection, target in zip(collections, targets):
            out = self.data / collection.name
            folders.append(out)
            measured += self._collect(
                f"compute/{collection.name}", out, store.COMPUTE_FILE, target, compute_sets is None,
                self.share("compute") * collection.weight / sum(weights), "shard set",
                lambda n, max_minutes, c=collection, o=out: collect_compute(
                    self.tables / c.tables, n, o, sets=c.sets, seed=0, backend=self.backend, progress=False,
                    max_minutes=max_minutes, **c.options))
        self._ran("compute", started, measured, sum(_count(f, store.COMPUTE_FILE) for f in folders))
        return folders

    def comm(self, comm_samples: int | None) -> list[Path]:
        """Stage 2: the exchange at every device count this machine runs."""
        counts = comm_device_counts(self.backend)
        if not counts:
            log.warning("this machine runs fewer than 2 processes at once: no exchange is timed (the checkpoint "
                        "carries the analytic communication model)")
        started, measured, folders = time.monotonic(), 0, []
        for devices in counts:
            out = self.data / "comm" / f"comm{devices}"
            folders.append(out)
            measured += self._collect(
                f"comm/{devices}", out, store.COMM_FILE, comm_samples or CEILING_COMM_SAMPLES, comm_samples is None,
                self.share("comm") / len(counts), "exchange sample",
                lambda n, max_minutes, d=devices, o=out: collect_comm(
                    d, n, o, backend=self.backend, progress=False, max_minutes=max_minutes, seed=0,
                    **self.profile.comm))
        self._ran("comm", started, measured, sum(_count(f, store.COMM_FILE) for f in folders))
        return folders

    def _collect(self, key: str, out: Path, filename: str, target: int, open_ended: bool, budget_s: float,
                 unit: str, collect: Callable[[int, float], int]) -> int:
        """One resumable collection: up to ``target`` samples in all (``open_ended``: a ceiling, not
        a count asked for), in what is left of its ``budget_s`` (earlier runs' seconds are in the
        state); returns the samples timed now."""
        done = _count(out, filename)
        left = budget_s - float(self.state["spent_s"].get(key, 0.0))
        if done >= target or left < 1.0:
            log.info("%s: %d %ss on disk, %.0f s of its share left: nothing to do", key, done, unit, max(left, 0.0))
            return 0
        started = time.monotonic()
        what = f"timing {unit}s"

        def on_count(n: int) -> None:  # open-ended: of as many as the share allows at the pace so far
            elapsed = time.monotonic() - started
            total = target if not open_ended else (
                n + round((n - done) / elapsed * max(0.0, left - elapsed)) if n > done and elapsed > 0 else None)
            self.bar.update(key, what, done=n, total=total)
        self.bar.update(key, what, done=done, total=None if open_ended else target)
        quiet_limit = _ShareSpent()
        collect_log = logging.getLogger(collect_comm.__module__)
        collect_log.addFilter(quiet_limit)
        try:
            with _Watch(out / filename, on_count, done):
                return collect(target, left / 60.0)
        finally:
            collect_log.removeFilter(quiet_limit)
            self.spend(key, time.monotonic() - started)
            self.say(f"{key}: {_count(out, filename)} {unit}s on disk ({time.monotonic() - started:.0f} s now, "
                     f"{left:.0f} s of its share were left)")

    def _ran(self, stage: str, started: float, measured: int, in_all: int) -> None:
        self.result.measured_now[stage] = measured
        self.result.in_all[stage] = in_all
        self.result.seconds[stage] = time.monotonic() - started

    def fit(self, compute_folders: Sequence[Path], comm_folders: Sequence[Path], **options: Any
            ) -> tuple[CostModels, dict]:
        """Stage 3: the models fitted on every folder that has enough (unless the checkpoint was
        fitted on exactly these counts with these options); (models, what they were fitted on)."""
        compute_folders = [f for f in compute_folders if _count(f, store.COMPUTE_FILE)]
        sets = sum(_count(f, store.COMPUTE_FILE) for f in compute_folders)
        if sets < MIN_COMPUTE_SETS:
            raise NeuroShardError(f"{sets} shard sets measured, {MIN_COMPUTE_SETS} needed to fit: give more "
                                  f"--minutes (a rerun continues where this one stopped)")
        for f in comm_folders:
            if 0 < _count(f, store.COMM_FILE) < MIN_COMM_SAMPLES:
                log.warning("%s: %d exchange samples, fewer than the %d a fit needs: not fitted (give more "
                            "--minutes; a rerun continues)", f, _count(f, store.COMM_FILE), MIN_COMM_SAMPLES)
        comm_folders = [f for f in comm_folders if _count(f, store.COMM_FILE) >= MIN_COMM_SAMPLES]
        signature = {"profile": self.profile.name, **options,
                     "compute": {f.name: _count(f, store.COMPUTE_FILE) for f in compute_folders},
                     "comm": {f.name: _count(f, store.COMM_FILE) for f in comm_folders}}
        path = self.folder / store.MACHINE_MODEL_FILE
        started = time.monotonic()
        if path.exists() and (self.state.get("fit") or {}).get("signature") == signature:
            self.result.skipped.append("fit")
            models = CostModels.load(path)
        else:
            self.bar.update("fit", f"neural, tree and analytic models on {sets} shard sets, held out and compared")
            try:
                models, record = fit_models(compute_folders, comm_folders, self.folder, self.result.fingerprint,
                                            **options)
                self.state["fit"] = {"signature": signature, **record}
            finally:
                self.spend("fit", time.monotonic() - started)
            self.say(f"fit: done in {time.monotonic() - started:.0f} s")
        self.result.seconds["fit"] = time.monotonic() - started
        return models, signature

    def dense(self) -> OperatorModels:
        """Stage 4: the operator benchmark, the parts its file lacks, sized to the share at this pace."""
        path = self.data / "operators-dense.json"
        started = time.monotonic()
        done = _dense_parts(path)
        if set(DENSE_PARTS) <= done:
            self.result.skipped.append("dense")
        else:
            size = self.profile.dense
            if size is None:
                self.result.pace["dense"] = machine_pace()
                size = dense_size(self.share("dense") / self.result.pace["dense"])
            timed: list[str] = []

            def on_part(part: str) -> None:  # called as each part starts: the ones before are done
                self.bar.update("dense", f"timing the operators of a training step: {part}",
                                done=len(done) + len(timed), total=len(DENSE_PARTS))
                timed.append(part)
            try:
                collect_dense(path, size, progress=on_part)
            finally:
                self.spend("dense", time.monotonic() - started)
            self.say(f"dense: {len(DENSE_PARTS)} parts timed ({time.monotonic() - started:.0f} s now)")
        self.result.seconds["dense"] = time.monotonic() - started
        return OperatorModels.read(path)

    def overheads(self, models: CostModels, operators: OperatorModels, fitted_on: dict,
                  calibrate: OverheadsFn | None, configs: Sequence[tuple]) -> None:
        """Stage 5: the overheads of real runs (``calibrate``: ``calibrate_overheads``), as many
        configurations as the share buys at this pace and the run has left; the machine's
        operator costs written (without overheads when ``calibrate`` is None)."""
        path = self.folder / store.MACHINE_OPERATORS_FILE
        signature = {"model": fitted_on, "dense_samples": len(operators.samples_),
                     "iterations": self.profile.overhead_iterations}
        started = time.monotonic()
        recorded = (self.state.get("overheads") or {}).get("signature")
        if calibrate is not None and path.exists() and recorded == signature:
            self.result.skipped.append("overheads")
            return
        chosen: list[tuple] = []
        distributed, configs = overhead_runs(self.backend, configs)
        if calibrate is not None and not configs:
            self.say(f"overheads: no real training run fits this machine's devices for {self.backend} "
                     f"(one {distributed} process a device, 2 at least): operator costs without overheads")
        if calibrate is not None and configs:
            room = min(self.share("overheads"),
                       self.deadline - time.monotonic() - 60.0 * self.minutes * (1.0 - sum(SHARES.values())))
            if self.profile.overhead_configs is None:
                self.result.pace["overheads"] = machine_pace()
                room /= self.result.pace["overheads"]
            chosen = choose_overhead_configs(configs, self.profile, room)
        if not chosen:
            operators.save(path)
            self.state["overheads"] = {"signature": None}
            write_state(self.folder, self.state)
            self.result.skipped.append("overheads")
            return
        runs: list[tuple] = []

        def on_config(config: tuple) -> None:
            self.bar.update("overheads", f"training {config[0]}'s {config[1]} tables on {config[5]} processes",
                            done=len(runs), total=len(chosen))
            runs.append(config)
        try:
            fitted = calibrate(models, operators, chosen, iterations=self.profile.overhead_iterations,
                               progress=on_config, backend=distributed)
        finally:
            self.spend("overheads", time.monotonic() - started)
        self.say(f"overheads: {len(chosen)} real training run{'s' if len(chosen) != 1 else ''} "
                 f"({time.monotonic() - started:.0f} s now)")
        fitted.save(path)
        self.state["overheads"] = {"signature": signature, "runs": len(chosen),
                                   "configs": [f"{c[0]}, {c[1]} tables, {c[5]} processes" for c in chosen]}
        write_state(self.folder, self.state)
        self.result.seconds["overheads"] = time.monotonic() - started

    def finish(self) -> HereResult:
        """The report, written and returned with the result."""
        result = self.result
        self.state["last_run"] = {"seconds": {k: round(v, 1) for k, v in result.seconds.items()},
                                  "pace": {k: round(v, 2) for k, v in result.pace.items()},
                                  "wall_s": round(time.monotonic() - self.started, 1), "minutes": self.minutes,
                                  "measured_now": result.measured_now, "skipped": result.skipped,
                                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_state(self.folder, self.state)
        result.report = format_report(self.state, self.folder,
                                      OperatorModels.read(self.folder / store.MACHINE_OPERATORS_FILE))
        atomic_write_text(self.folder / store.MACHINE_REPORT_FILE, result.report)
        return result


def _count(folder: Path, filename: str) -> int:
    return len(store.done_samples(folder, filename)) if folder.is_dir() else 0


def _dense_parts(path: Path) -> set:
    if not path.exists():
        return set()
    return {s.get("part") for s in OperatorModels.read(path).samples_}
