"""Pre-train for this machine in one command (``neuroshard pretrain --here``).

On the machine it runs on, within a wall-clock budget (``minutes``, split over the stages by
fixed shares, ``SHARES``), this collects what the search and the iteration model ask about,
fits the cost models, holds out, reports, and keeps the result in this machine's folder
(``costmodels.measure.store.machine_dir``: ``$XDG_CACHE_HOME/neuroshard/machines/<fingerprint>/``),
which ``load_cost_models()`` and ``load_operator_models()`` then use by themselves whenever
the machine's fingerprint matches:

1. **compute**: shard sets timed as one fused kernel (``collect.collect_compute``) over tables
   of the training families ``TRAINING_FAMILIES`` only: per family, devices of plans searched
   on random 4-16-device tasks (``--sets plans``: the sets the search asks about) and random
   augmented sets of 1-80 shards (row slices and column strips, up to 3 GiB of weights: working
   sets beyond the last-level cache); and sets of the families' big hot tables beside their
   small ones;
2. **comm**: the runtime's exchange (all-to-all) at every device count this machine can run:
   2 to min(cores, 4) gloo processes (on ``cuda``, 2 to min(GPUs, 4));
3. **fit**: ``costmodels.pretrain`` on all of it (the neural, tree and analytic models held out
   and compared; an ensemble of neural models written), with held-out error per family and per
   model kind, and the shipped checkpoint's on the same held-out sets for reference;
4. **dense**: the operators of a training step besides the embeddings (``collect dense``);
5. **overheads**: the runtime's overheads in real runs (``collect overheads``) of the training
   families' configurations, priced with the model of stage 3.

The families ``HELD_OUT_FAMILIES`` (criteo-kaggle, criteo-terabyte, hot-few) are never
collected: they are the held-out families of the benchmark that judges the model. The one
exception is the dense stage's timing of a rank's data loading, which uses the operator
benchmark's own mix of tables (``costmodels.measure.dense.INPUT_FAMILIES``, criteo-kaggle and
hot-few tables among them): it prices the iteration model's input pipeline, not the embedding
costs that benchmark judges.

The collections stop when their share of the budget is spent (or at ``--compute-sets`` /
``--comm-sets``); the operator benchmark and the overhead runs are sized from their shares at
the pace of a quiet 2-core machine (``DENSE_FULL_SECONDS``, ``OVERHEAD_CONFIG_SECONDS``)
divided by this machine's pace now (``machine_pace``: a loaded machine measures less), the
overhead runs also within what the run has left.

Every stage resumes: collections continue their folders (``collect`` skips what is on disk),
the operator benchmark measures only the parts its file lacks, and a stage whose outputs are
up to date is skipped; the seconds each stage spent are kept in ``machine.json``, so a rerun
after an interruption spends only what is left of each share, and a rerun of a finished
command times nothing. Progress (``measured.progress``): one line updated in place on a
terminal, plain lines in a log, nothing when quiet: the stage, what is being timed, how many of
how many, and the time left of the budget.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..constants import MEASURED_BATCH_SIZE
from ..costmodels.base import CostModels
from ..costmodels.dense import OperatorModels
from ..costmodels.loading import DEFAULT_CHECKPOINT, this_machine_name
from ..costmodels.measure import store
from ..costmodels.measure.dense import PARTS as DENSE_PARTS
from ..costmodels.measure.dense import collect_dense
from ..costmodels.metrics import gmae
from ..costmodels.pretrain import ComputeData, PretrainResult, format_table, parity_plot, pretrain
from ..datasets.families import generate
from ..errors import NeuroShardError
from ..io import atomic_write_text
from ..tables import Table, TableSet
from ..validate import check_int, check_number, read_json
from .collect import collect_comm, collect_compute
from .progress import PROGRESS_MODES, Progress

log = logging.getLogger(__name__)

#: the families collected: the benchmark's held-out families are not among them
TRAINING_FAMILIES = ("dlrm-2021", "dlrm-2022", "broad")
#: never collected here: the held-out families of the benchmark that judges the model
HELD_OUT_FAMILIES = ("criteo-kaggle", "criteo-terabyte", "hot-few")
#: the default wall-clock budget (minutes): the command finishes within 30 on a 2-core machine
DEFAULT_MINUTES = 25.0
#: each stage's share of the budget (the rest: start-up, table generation, the report)
SHARES = {"compute": 0.48, "comm": 0.08, "fit": 0.08, "dense": 0.16, "overheads": 0.14}
#: ``collect dense``'s full size takes about this long on a quiet 2-core machine: the dense
#: stage measures the share of it that its budget buys (at least ``MIN_DENSE_FRACTION``)
DENSE_FULL_SECONDS = 300.0
MIN_DENSE_FRACTION = 0.2
#: one overhead configuration (4 plans trained together, 12 iterations) on a 2-core machine
OVERHEAD_CONFIG_SECONDS = 25.0
#: the slowest pace ``machine_pace`` reports
MAX_PACE = 10.0
#: a collection stops at this many samples if its time share has not stopped it before
CEILING_COMPUTE_SETS = 2000
CEILING_COMM_SAMPLES = 300
#: fewest exchange samples per device count (a fifth is held out; the tree model needs 4 to fit)
MIN_COMM_SAMPLES = 6
#: fewest shard sets a fit takes (``costmodels.pretrain`` holds out a fifth, then validates on 10 of
#: the rest, and a neural model fits on 4 at least)
MIN_COMPUTE_SETS = 18
#: the most processes the exchange is timed at
MAX_COMM_DEVICES = 4
STATE_FILE = "machine.json"
STATE_FORMAT = "neuroshard.machine/v1"
#: sets of tables from several families (the hot collection's) are reported under this name
MIXED = "mixed"


# ------------------------------------------------------------------ profiles
@dataclass(frozen=True)
class Collection:
    """One compute folder: its tables file, which sets (``plans`` or ``random``), its weight in
    the compute share, and ``collect_compute``'s settings."""

    name: str
    tables: str
    sets: str
    weight: float
    options: dict


@dataclass(frozen=True)
class Profile:
    """What is measured and how (a folder measured under one profile is refused by another:
    each profile has its own data folder). ``default`` is the real thing; ``tiny`` is a smoke
    test of the command (a minute or two), whose model is not worth searching with."""

    name: str
    tables_per_family: int
    family_seeds: dict
    heavy_tables: int            # of each family's pool: the heaviest (rows x lookups) go to the hot pool
    collections: tuple
    comm: dict                   # collect_comm's settings
    compute_sets: int | None     # None: the time share decides (up to CEILING_COMPUTE_SETS a folder)
    comm_samples: int | None
    dense: dict | None           # collect_dense's size (None: scaled to the budget)
    overhead_configs: int | None  # None: as many as the budget buys
    overhead_iterations: int
    epochs: int
    ensemble: int


def _collections(random: dict, hot: dict, plans: dict) -> tuple:
    out = []
    for family in TRAINING_FAMILIES:
        out.append(Collection(f"plans-{family}", f"{family}.json", "plans", 2.0, plans))
        out.append(Collection(f"random-{family}", f"{family}.json", "random", 2.3, random))
    out.append(Collection("hot", "hot.json", "random", 2.1, hot))
    return tuple(out)


_TIMING = {"repeats": 3, "max_repeats": 5}
PROFILES: dict[str, Profile] = {
    "default": Profile(
        "default", 120, {"dlrm-2021": 4001, "dlrm-2022": 4002, "broad": 4003}, 16,
        _collections(random={"max_tables": 80, "memory_bytes": 3 << 30, "row_split_prob": 0.3, **_TIMING},
                     hot={"max_tables": 80, "memory_bytes": 4 << 30, "row_split_prob": 0.4, **_TIMING},
                     plans={"memory_bytes": 64 << 30, **_TIMING}),
        comm={}, compute_sets=None, comm_samples=None, dense=None, overhead_configs=None, overhead_iterations=12,
        epochs=80, ensemble=3),
    "tiny": Profile(
        "tiny", 12, {"dlrm-2021": 4001, "dlrm-2022": 4002, "broad": 4003}, 3,
        _collections(random={"max_tables": 6, "memory_bytes": 256 << 20, "row_split_prob": 0.3, "warmup": 1,
                             "repeats": 1, "max_repeats": 1},
                     hot={"max_tables": 6, "memory_bytes": 512 << 20, "row_split_prob": 0.5, "warmup": 1,
                          "repeats": 1, "max_repeats": 1},
                     plans={"memory_bytes": 64 << 30, "warmup": 1, "repeats": 1, "max_repeats": 1}),
        comm={"warmup": 1, "repeats": 3}, compute_sets=18, comm_samples=MIN_COMM_SAMPLES,
        dense={"layers": {"count": 12, "rounds": 1, "min_ms": 0.5}, "optimizer": {"count": 6, "rounds": 1},
               "input": {"count": 6, "rounds": 1},
               "collectives": {"ranks": (2,), "rounds": 1, "sizes": [4096, 1 << 20]},
               "embedding_split": {"count": 2}},
        overhead_configs=1, overhead_iterations=4, epochs=5, ensemble=2),
}


def dense_fraction(seconds: float) -> float:
    """The share of ``collect dense``'s full size that ``seconds`` buy (``DENSE_FULL_SECONDS`` for all)."""
    return float(np.clip(seconds / DENSE_FULL_SECONDS, MIN_DENSE_FRACTION, 1.0))


def dense_size(seconds: float) -> dict:
    """``collect dense``'s sample counts (and collective rounds) scaled to ``seconds``."""
    f = dense_fraction(seconds)
    return {"layers": {"count": max(12, round(240 * f))}, "optimizer": {"count": max(6, round(40 * f))},
            "input": {"count": max(6, round(60 * f))}, "collectives": {"rounds": max(2, round(5 * f))},
            "embedding_split": {"count": max(3, round(30 * f))}}


def machine_pace(probes: int = 5, seconds: float = 0.3) -> float:
    """How much slower than its own CPU time a single-threaded loop runs now (the median of
    ``probes`` loops of ``seconds``): 1 on an idle core, about the runnable threads per core on a
    loaded machine (3-4 on this project's shared 2-core VM at load 7-10). The stages that are
    sized rather than timed (the operator benchmark, the overhead runs) divide their share by
    it, so a loaded machine measures less instead of overrunning the budget. At most
    ``MAX_PACE``."""
    paces = []
    for _ in range(probes):
        wall, cpu = time.perf_counter(), time.thread_time()
        x = 0
        while time.perf_counter() - wall < seconds:
            for i in range(10_000):
                x += i
        paces.append((time.perf_counter() - wall) / max(time.thread_time() - cpu, 1e-6))
    return float(np.clip(np.median(paces), 1.0, MAX_PACE))


def split_count(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders; each at least 1)."""
    w = np.asarray(weights, dtype=np.float64)
    raw = total * w / w.sum()
    out = np.maximum(np.floor(raw).astype(int), 1)
    for i in np.argsort(-(raw - np.floor(raw))):
        if out.sum() >= total:
            break
        out[i] += 1
    return [int(x) for x in out]


def comm_device_counts(backend: str) -> list[int]:
    """The device counts this machine can run the exchange at: 2 to min(cores, 4) gloo
    processes, or on ``cuda`` 2 to min(GPUs, 4)."""
    if backend == "cuda":
        import torch
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    else:
        available = os.cpu_count() or 1
    return list(range(2, min(available, MAX_COMM_DEVICES) + 1))


# -------------------------------------------------------------------- tables
def family_of(table_name: str) -> str:
    """The training family a collected table's name starts with (``broad-t012`` -> ``broad``)."""
    for family in sorted(TRAINING_FAMILIES, key=len, reverse=True):
        if table_name.startswith(family + "-"):
            return family
    return MIXED


def write_pools(folder: Path, profile: Profile) -> None:
    """Each training family's tables (named ``<family>-<table>``) and the hot pool (each family's
    ``heavy_tables`` heaviest tables, rows x lookups, beside its smallest), once: a folder keeps
    the files it was measured with (their hash is in every collection's ``meta.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    hot: list[Table] = []
    for family in TRAINING_FAMILIES:
        path = folder / f"{family}.json"
        if path.exists():
            tables = TableSet.read(path).tables
        else:
            generated = generate(family, profile.tables_per_family, profile.family_seeds[family])
            tables = []
            for t in generated:
                t.name = f"{family}-{t.name}"
                tables.append(t)
            TableSet(f"{family}-machine", tables, MEASURED_BATCH_SIZE,
                     {"family": family, "seed": profile.family_seeds[family]}).write(path)
        weight = sorted(tables, key=lambda t: -t.num_embeddings * float(t.pooling_factor))
        small = sorted(weight[profile.heavy_tables:], key=lambda t: t.num_embeddings)
        hot += weight[:profile.heavy_tables] + small[:len(small) // 2]
    path = folder / "hot.json"
    if not path.exists():
        TableSet("hot-beside-small", hot, MEASURED_BATCH_SIZE,
                 {"families": list(TRAINING_FAMILIES), "note": "each family's heaviest tables beside its smallest"}
                 ).write(path)


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


def pretrain_here(minutes: float = DEFAULT_MINUTES, *, size: str = "default", backend: str = "cpu",
                  compute_sets: int | None = None, comm_samples: int | None = None,
                  epochs: int | None = None, ensemble: int | None = None, test_tables: float = 0.25,
                  tune: int = 0, seed: int = 0, out: str | Path | None = None,
                  overheads: OverheadsFn | None = None, overhead_configs: Sequence[tuple] = (),
                  progress: str = "auto") -> HereResult:
    """Collect, fit, hold out and report for this machine into its folder (module docstring).

    ``size``: a profile of ``PROFILES``; ``compute_sets`` / ``comm_samples``: how many shard
    sets in all (split over the collections) and exchange samples per device count, instead
    of as many as the time shares allow; ``epochs``, ``ensemble``, ``test_tables``, ``tune``,
    ``seed``: ``costmodels.pretrain``'s (default: the profile's); ``out``: also write the
    checkpoint there. ``overheads``: ``runtime.overheads.calibrate_overheads`` (the runtime
    sits above this layer: the caller hands it in, with its ``overhead_configs``); without it
    the operator costs carry no overheads of real runs. ``progress``: a mode of
    ``measured.progress`` (``auto``: a line updated in place on a terminal, plain lines
    otherwise; ``quiet``: nothing)."""
    if size not in PROFILES:
        raise NeuroShardError(f"unknown size {size!r}; choose one of {', '.join(PROFILES)}")
    if backend not in ("cpu", "cuda"):
        raise NeuroShardError(f"unknown device {backend!r}; choose cpu or cuda")
    check_number(minutes, "minutes", 1.0 / 60, 24 * 60.0)
    profile = PROFILES[size]
    if compute_sets is None:
        compute_sets = profile.compute_sets
    else:
        check_int(compute_sets, "compute sets", MIN_COMPUTE_SETS, 10**6)
    if comm_samples is None:
        comm_samples = profile.comm_samples
    else:
        check_int(comm_samples, "comm samples", MIN_COMM_SAMPLES, 10**6)
    epochs = profile.epochs if epochs is None else epochs
    ensemble = profile.ensemble if ensemble is None else ensemble
    if progress not in PROGRESS_MODES:
        raise NeuroShardError(f"unknown progress mode {progress!r}; choose one of {', '.join(PROGRESS_MODES)}")
    if backend == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise NeuroShardError("--device cuda asked for, but torch sees no CUDA device")

    folder = store.machine_dir(backend)
    run = _Run(folder, store.machine_fingerprint(backend), PROFILES[size], minutes, backend, progress)
    try:
        run.say(f"{store.describe_fingerprint(run.result.fingerprint)}; folder {folder}; budget {minutes:g} minutes")
        compute_folders = run.compute(compute_sets)
        comm_folders = run.comm(comm_samples)
        models, signature = run.fit(compute_folders, comm_folders, epochs=epochs, ensemble=ensemble,
                                    test_tables=test_tables, tune=tune, seed=seed)
        if out is not None:
            models.save(out)
        operators = run.dense()
        run.overheads(models, operators, signature, overheads, overhead_configs)
        return run.finish()
    finally:
        run.bar.close()


class _Run:
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
                models, record = _fit(compute_folders, comm_folders, self.folder, self.result.fingerprint, **options)
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
        if calibrate is not None:
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
                               progress=on_config)
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


def choose_overhead_configs(configs: Sequence[tuple], profile: Profile, seconds: float) -> list[tuple]:
    """The overhead configurations of the training families (a configuration is ``(family,
    tables, seed, model, batch, processes)``), alternating process counts, as many as
    ``seconds`` buy (``OVERHEAD_CONFIG_SECONDS`` each, 2 at least: one per process count) or
    the profile fixes."""
    allowed = [c for c in configs if c[0] in TRAINING_FAMILIES]
    by_ranks: dict[int, list[tuple]] = {}
    for c in allowed:
        by_ranks.setdefault(int(c[5]), []).append(c)
    order: list[tuple] = []
    lists = [by_ranks[r] for r in sorted(by_ranks)]
    for i in range(max((len(x) for x in lists), default=0)):
        order += [x[i] for x in lists if i < len(x)]
    count = (profile.overhead_configs if profile.overhead_configs is not None
             else max(2, int(max(seconds, 0.0) // OVERHEAD_CONFIG_SECONDS)))
    return order[:count]


# ----------------------------------------------------------------------- fit
def _fit(compute_folders: Sequence[Path], comm_folders: Sequence[Path], folder: Path, fingerprint: dict, *,
         epochs: int, ensemble: int, test_tables: float, tune: int, seed: int) -> tuple[CostModels, dict]:
    """``costmodels.pretrain`` on the machine's data; the bundle named and marked as this
    machine's, saved with its parity plot; and what the report needs (held-out errors per
    family and model kind, the shipped checkpoint's on the same sets)."""
    result = pretrain(compute_folders, comm_folders, out=None, tune=tune, epochs=epochs, test_tables=test_tables,
                      seed=seed, refit=True, ensemble=ensemble)
    models = result.models
    models.name = f"pretrained-here-{folder.name[:8]}"
    models.hardware = {**(models.hardware or {}), "machine": {"id": folder.name, "fingerprint": fingerprint,
                                                              "command": "neuroshard pretrain --here"}}
    models.save(folder / store.MACHINE_MODEL_FILE)
    parity_plot(folder / "model.parity.png", result.compute_models, result.compute_test, result.comm_models,
                result.comm_test)
    record = {"summary": models.data_summary.get("compute", {}),
              "comm_summary": models.data_summary.get("comm", {}),
              "families": family_errors(result),
              "table": format_table(result.table),
              "fitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return models, record


def family_errors(result: PretrainResult) -> list[dict]:
    """Held-out GMAE of each compute model kind (and of the shipped checkpoint, measured on
    another machine) per family of the held-out sets' tables (``mixed``: tables of several), and
    over all of them."""
    test = result.compute_test
    if test is None or len(test) == 0:
        return []
    models: dict[str, Any] = dict(result.compute_models)
    shipped = _shipped_compute(test.batch_size)
    if shipped is not None:
        models["shipped (another machine)"] = shipped
    families = np.array([_set_family(t) for t in test.tables])
    rows = []
    for family in [*TRAINING_FAMILIES, MIXED, "all"]:
        rows_of = np.arange(len(test)) if family == "all" else np.flatnonzero(families == family)
        if len(rows_of) == 0:
            continue
        subset = test.subset(rows_of)
        row = {"family": family, "sets": int(len(rows_of))}
        for name, model in models.items():
            row[name] = _gmae(model, subset)
        rows.append(row)
    return rows


def _set_family(tables: frozenset) -> str:
    families = {family_of(name) for name in tables}
    return families.pop() if len(families) == 1 else MIXED


def _gmae(model: Any, data: ComputeData) -> float:
    return gmae(np.asarray(model.predict(data.sets), dtype=np.float64), data.costs_ms)


def _shipped_compute(batch_size: int):
    """The shipped checkpoint's compute model when it was measured at ``batch_size`` (None otherwise)."""
    if not DEFAULT_CHECKPOINT.exists():
        return None
    try:
        shipped = CostModels.load(DEFAULT_CHECKPOINT)
    except NeuroShardError as exc:
        log.warning("the shipped checkpoint is not compared: %s", exc)
        return None
    return shipped.compute if shipped.batch_size == batch_size else None


# -------------------------------------------------------------------- report
def format_report(state: dict, folder: Path, operators: OperatorModels) -> str:
    """``report.txt``: the machine, what was measured, the held-out errors per family and model
    kind, the operators' errors and overheads, and each stage's time."""
    fingerprint = state.get("fingerprint") or {}
    fit = state.get("fit") or {}
    summary = fit.get("summary") or {}
    lines = [f"neuroshard pretrain --here: the cost models of {this_machine_name(folder.name)}",
             f"machine: {store.describe_fingerprint(fingerprint)}",
             f"folder: {folder}",
             f"training families (collected): {', '.join(TRAINING_FAMILIES)}; held out (never collected: the "
             f"benchmark that judges the model uses them): {', '.join(HELD_OUT_FAMILIES)} (the operator benchmark "
             f"times a rank's data loading on its own mix of tables, these among them)", ""]
    if summary:
        low, high = summary.get("cost_ms_range", [0.0, 0.0])
        lines.append(f"compute: {summary.get('shard_sets')} shard sets over {summary.get('source_tables')} tables "
                     f"({summary.get('shards_per_set_mean', 0):.1f} shards a set on average, "
                     f"{low:.2f}-{high:.1f} ms); "
                     f"held out: {summary.get('test_sets')} sets, split {summary.get('split')}")
    comm = fit.get("comm_summary") or {}
    if comm.get("samples"):
        lines.append("exchange: " + ", ".join(f"{n} samples at {d} devices" for d, n in comm["samples"].items()))
    families = fit.get("families") or []
    if families:
        kinds = [k for k in families[0] if k not in ("family", "sets")]
        lines += ["", "held-out GMAE per family and model kind (compute; the neural row is one member's recipe; "
                      "the shipped checkpoint was measured on another machine):",
                  f"  {'family':12s} {'sets':>5s}  " + "  ".join(f"{k:>12s}" for k in kinds)]
        for row in families:
            lines.append(f"  {row['family']:12s} {row['sets']:5d}  "
                         + "  ".join(f"{100 * row[k]:11.1f}%" for k in kinds))
    if fit.get("table"):
        lines += ["", "held-out metrics of every model (pretrain's table):", fit["table"]]
    lines += ["", "operator costs (the iteration model's):", operators.format_metrics()]
    if operators.overheads_:
        lines.append(f"  overheads of {len({p.get('run') for p in operators.overhead_points_})} real runs "
                     f"(measured = fixed + scale x predicted, per term and processes):")
        for term, per in operators.overheads_.items():
            lines.append(f"    {term:20s} " + "  ".join(f"{r} processes: +{a:.3f} ms, x{b:.2f}"
                                                       for r, (a, b) in sorted(per.items())))
    else:
        lines.append("  no overheads of real runs")
    last = state.get("last_run") or {}
    if last:
        lines += ["", f"last run: {last.get('wall_s', 0) / 60:.1f} minutes of a {last.get('minutes')}-minute budget; "
                      + ", ".join(f"{k} {v:.0f} s" for k, v in (last.get("seconds") or {}).items())
                      + (f"; up to date, not run again: {', '.join(last['skipped'])}" if last.get("skipped") else "")
                      + ("; pace (wall clock over CPU time of a loop: 1 on an idle machine) "
                         + ", ".join(f"{k} {v:.1f}" for k, v in last["pace"].items()) if last.get("pace") else "")]
    spent = state.get("spent_s") or {}
    if spent:
        lines.append("seconds spent in all runs: " + ", ".join(f"{k} {v:.0f}" for k, v in spent.items()))
    return "\n".join(lines) + "\n"
