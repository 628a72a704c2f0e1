"""What the benchmarks in experiments/ share (none of them imports another).

* ``write_source``: a run's provenance (the command, the date, the commit and the CPU) as
  ``SOURCE.json`` beside its results, which ``report.py`` prints with every table;
* ``iteration_sets`` and ``decide``: the stored runs of ``iteration_benchmark.py`` and the rule
  that says which of their sets are decided (``report.py`` and ``iteration_ranking_ceiling.py``).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
#: the iteration benchmark's suites measured in turns of 3 steps, in the order they ran
#: (``results/iteration_model/<suite>/configs.jsonl``)
ITERATION_SUITES = ("turns", "two-process", "embedding-heavy", "turns-two", "with-measured", "with-measured-two")


def cpu_name() -> str:
    """The CPU as ``lscpu`` names it, with its family and model where Linux says them."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    name = info.get("model name", platform.processor() or platform.machine())
    if "cpu family" in info:
        name += f", family {info['cpu family']} model {info.get('model', '?')}"
    try:
        name += f", {len(os.sched_getaffinity(0))} cores"
    except (AttributeError, OSError):
        pass
    return name


def commit() -> str:
    """The repository's commit (short hash), with ``+changes`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def source_record(command: str | None = None, **extra) -> dict:
    """What made a result: the command (default: this process's), the date (UTC), the commit, the CPU."""
    if command is None:
        script = Path(sys.argv[0])
        try:
            script = script.resolve().relative_to(ROOT)
        except ValueError:
            pass
        command = " ".join(["python", str(script), *sys.argv[1:]])
    return {"command": command, "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "commit": commit(), "cpu": cpu_name(), **extra}


def write_source(out: str | Path, command: str | None = None, name: str = "SOURCE.json", **extra) -> Path:
    """``source_record`` written to ``out/name``."""
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(source_record(command, **extra), indent=1) + "\n")
    return path


def iteration_sets(suites=ITERATION_SUITES, results: Path = RESULTS / "iteration_model") -> list[dict]:
    """Every stored set of ``suites``: its suite, seed, processes, plan names, the predicted step
    (``predicted_ms`` as the run stored it) and the two runs' measured steps (``run1``, ``run2``), in ms."""
    sets = []
    for suite in suites:
        path = Path(results) / suite / "configs.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if line.strip():
                c = json.loads(line)
                plans = c["plans"]
                sets.append({"suite": suite, "seed": c["seed"], "family": c["family"], "ranks": c["devices"],
                             "plans": [p["plan"] for p in plans],
                             "predicted": np.array([p["predicted_ms"] for p in plans]),
                             "run1": np.array([p["run1_ms"] for p in plans]),
                             "run2": np.array([p["run2_ms"] for p in plans])})
    return sets


def decide(run1: np.ndarray, run2: np.ndarray, margin: float = 1.0,
           drift_free: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Which sets are decided, over rows of log steps (one row a set, or a draw of one): a set is
    decided when the plan of the least mean step was fastest in both runs and its lead over the
    second is at least ``margin`` times the set's A/A noise, the median |log(run 1 / run 2)| of its
    plans (``drift_free``: the same with the set's mean shift between the runs taken off, the noise
    of a comparison inside one run). Returns (decided, index of the measured fastest) per row."""
    mean = 0.5 * (run1 + run2)
    d = run1 - run2
    if drift_free:
        d = d - d.mean(axis=1, keepdims=True)
    noise = np.median(np.abs(d), axis=1)
    order = np.argsort(mean, axis=1)
    first, second = order[:, 0], order[:, 1]
    rows = np.arange(len(mean))
    lead = mean[rows, second] - mean[rows, first]
    agree = (np.argmin(run1, axis=1) == first) & (np.argmin(run2, axis=1) == first)
    return agree & (lead >= margin * noise), first
