"""On one CUDA GPU: pre-train as a user does (``neuroshard pretrain --here``), then search and time plans.

    PYTHONPATH=. python experiments/cuda_paths.py --out DIR     # repo root, one CUDA GPU: 6-8 minutes

(The package need not be installed: the script puts the repository root on the path of
itself and of every step it starts; ``PYTHONPATH=.`` only makes that explicit.)

Steps, in this order; each is its own process with its own wall-clock limit (at its limit it
is sent SIGTERM, then SIGKILL 10 s later), writes its results to ``--out`` as soon as it ends
(so a kill loses nothing already finished), and is skipped, said so in ``summary.txt``, when
what is left of ``--budget-s`` (default 510 s) cannot fit it (the later steps' expected times
are kept in reserve).

H. ``here`` (default): ``neuroshard pretrain --here --device cuda --minutes M --size S``
   (``--here-minutes``, default 4.5; ``--here-size``, default ``default``) with
   ``XDG_CACHE_HOME=DIR/cache``, so the machine's folder
   (``DIR/cache/neuroshard/machines/<fingerprint>/``: ``model.pt``, ``report.txt``,
   ``machine.json`` and the data) comes back with the results and a rerun into the same
   ``--out`` continues it. Limit: M minutes + 90 s, within the budget less step C's reserve;
   about 5 minutes at the default. On one GPU its stages measure:
   compute (48% of M): shard sets of dlrm-2021, dlrm-2022 and broad tables (devices of searched
   plans, random sets of up to 80 shards, hot tables beside small ones) timed on the GPU;
   comm: nothing, the exchange is timed at 2 to min(GPUs, 4) processes, so the model keeps the
   analytic exchange model; fit (on the CPU): neural, tree and analytic models held out per
   family beside the shipped checkpoint; dense: the operators of a training step on the host
   CPU, not the GPU (``collect_dense`` takes no device); overheads: real training runs of 2 and
   3 NCCL processes, one a GPU, so none on one GPU (the operator costs then carry no overheads,
   and the command says so). Step C's GPU model is that ``model.pt``; ``summary.txt`` gets the
   report's held-out tables (from ``machine.json`` when ``report.txt`` was not written).
A. ``collect`` (older runs, ``--steps``): ``neuroshard collect compute --device cuda`` of
   random sets (1 to ``--max-tables-per-device`` shards, default 32, at most 3 GiB, 30% row
   slices, widths 4..128, rows at most ``--row-cap``) of the shipped CPU checkpoint's wide
   tables, for ``--collect-minutes`` (default 3) into ``DIR/gpu-compute``; resumable.
B. ``pretrain`` (older runs): ``neuroshard pretrain`` on that data into ``DIR/gpu.pt``
   (``--epochs auto``: 250,000 set-epochs over the sets, 30 to 200); its held-out table goes to
   the summary. Step C's GPU model is the last made in this run (``pretrain``'s, then
   ``here``'s), else ``--gpu-checkpoint``, else that of a ``here`` run before into the same ``--out``.
C. ``plans``: per family (default criteo-terabyte and dlrm-2021, never collected), one task
   at ``--devices`` (default 8; 8-12 tables per device, seed 31) on one host of that many GPUs
   (``Topology(devices, local_world_size=devices)``: the exchange is costed analytically over
   the host's links): NeuroShard searched with the GPU model and with the shipped CPU
   checkpoint, the greedy baselines (all but random), and an A/A copy of size-lookup, every
   device of every plan timed on the GPU in one interleaved ``measure_plans`` run (CUDA
   events, the fastest of ``--passes`` after one warm-up pass). Printed: each plan's measured
   max device over the best baseline's, its total compute, each model's predicted max against
   the measured one, and which model a search with no ``--cost-model`` loads here (the
   machine's, when ``here`` ran). About a minute per family (own process).
D. ``runtime`` (not by default): ``train`` and ``evaluate`` a one-device plan of 16 dlrm-2021
   tables on one GPU (NCCL, one process: one GPU cannot hold two NCCL ranks), and
   ``estimate`` it with the shipped CPU iteration model; needs 120 s of budget left.

``--steps here`` and then ``--steps plans`` into the same ``--out`` split the run in two calls
(step C finds the machine's model there); ``--steps collect pretrain plans`` is the earlier default.

``--backend cpu`` is a dry run on a machine without a GPU (every CUDA step on the CPU, NCCL
replaced by gloo; ``here`` then measures the CPU, comm included), with tiny sizes (about 2.5
minutes on a 2-core VM; below 4 ``--here-minutes`` tiny may time fewer than the 18 sets it fits on)::

    python experiments/cuda_paths.py --out /tmp/dry --backend cpu --here-size tiny --here-minutes 4 \\
        --devices 2 --families dlrm-2021 --tables-per-device 2 3 --row-cap 100000 --passes 2 --budget-s 400

Everything lands in ``--out``: ``log.txt`` (every step's output), ``cache/`` (``here``'s
machine folder), ``gpu-compute/`` and ``gpu.pt`` (collect, pretrain), ``measured-FAMILY.txt``
and ``plans-FAMILY.json`` per family, ``plans.json`` (all rows), ``status.json`` and
``summary.txt`` (rewritten after every step).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import write_source
START = time.monotonic()  # the budget counts from here
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from neuroshard.costmodels.loading import DEFAULT_CHECKPOINT  # noqa: E402  (the shipped CPU checkpoint)
from neuroshard.costmodels.samples import store  # noqa: E402
from neuroshard.costmodels.pretrain import MIN_SETS  # noqa: E402  (fewest measured sets pretrain trains on)

STEPS = ("here", "collect", "pretrain", "plans", "runtime")
DEFAULT_STEPS = ("here", "plans")
#: seconds the ``here`` step may run beyond its ``--minutes``: start-up, the fit's and the sized stages' overrun
HERE_OVER_S = 90
#: seconds between a step's SIGTERM at its limit and its SIGKILL
GRACE_S = 10
#: the tables the shipped CPU checkpoint's wide data was drawn from (no benchmark family)
COLLECT_TABLES = ROOT / "neuroshard/checkpoints/data/cpu/compute-wide/tables.json"
#: expected seconds of a step (the reserve kept for it while an earlier step runs), and its limit
EXPECTED_S = {"collect": 210, "pretrain": 70, "plans": 85, "runtime": 300}
#: a collect step's start (imports, CUDA context, reading the tables) and its last sample, seconds
COLLECT_OVERHEAD_S = 30
#: set-epochs of ``--epochs auto``: epochs = this / sets, within [EPOCHS_MIN, EPOCHS_MAX]
AUTO_SET_EPOCHS, EPOCHS_MIN, EPOCHS_MAX = 250_000, 30, 200
AA_NAME = "A/A size-lookup again"


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


#: the step process running now (killed with its group when this script is told to stop)
_RUNNING: list[subprocess.Popen] = []


def _kill_group(proc: subprocess.Popen, signum: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(signum, frame) -> None:
    """SIGTERM/SIGINT/SIGHUP (e.g. an outer time limit): end the running step's processes too
    (they run in their own process group), then exit."""
    for proc in _RUNNING:
        _kill_group(proc)
    print(f"stopped by signal {signum}; the results of finished steps are in --out", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def run(cmd: list[str], log: Path, timeout: float, label: str, env: dict | None = None) -> tuple[int, float]:
    """One step's process (``env``: variables added to this one's), its output appended to
    ``log``; (exit status, seconds). On timeout its whole process group is sent SIGTERM, then
    SIGKILL ``GRACE_S`` later, and the status is 124."""
    start = time.monotonic()
    with log.open("a") as f:
        shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        f.write(f"\n$ {shown + ' ' if shown else ''}{' '.join(cmd)}    # limit {timeout:.0f} s\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(env), cwd=ROOT,
                                start_new_session=True)
        _RUNNING.append(proc)
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGTERM)  # pretrain --here and collect keep what they measured
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
            rc = 124
        finally:
            _RUNNING.remove(proc)
        f.write(f"[exit {rc} after {time.monotonic() - start:.1f} s]\n")
    seconds = time.monotonic() - start
    print(f"[rc {rc}, {seconds:.0f} s] {label}", flush=True)
    return rc, seconds


# ------------------------------------------------------------------ step C, in its own process
def plans_worker(args: argparse.Namespace) -> int:
    """Step C for one family: search, then time every device of every plan on ``--backend``;
    writes ``measured-FAMILY.txt``/``.json`` and ``plans-FAMILY.json``."""
    from neuroshard.costmodels import load_cost_models
    from neuroshard.costmodels.loading import this_machine_name
    from neuroshard.datasets.families import family_tasks
    from neuroshard.runtime.measure_plan import estimate_gmae, measure_plans
    from neuroshard.search.api import search_plan
    from neuroshard.search.registry import GREEDY_ALGORITHMS
    from neuroshard.search.simulator import Simulator
    from neuroshard.topology import Topology

    family, devices, out = args.plans_worker, args.devices, args.out
    started = time.monotonic()
    cpu_models = load_cost_models(args.cpu_checkpoint or DEFAULT_CHECKPOINT)
    default = store.this_machine_file(store.MACHINE_MODEL_FILE)  # what a search with no --cost-model loads here
    gpu_models = load_cost_models(args.gpu_checkpoint) if args.gpu_checkpoint else None
    models = {"CPU": cpu_models, **({"GPU": gpu_models} if gpu_models is not None else {})}
    tables, memory = family_tasks(family, devices, 1, tables_per_device=tuple(args.tables_per_device),
                                  seed=args.task_seed)[0]
    tables.batch_size = cpu_models.batch_size
    topology = Topology(devices, local_world_size=devices)  # one host: the exchange over its links, analytic
    plans, search_s = {}, {}
    searches = ([("neuroshard (GPU ckpt)", "neuroshard", gpu_models)] if gpu_models is not None else []) + \
        [("neuroshard (CPU ckpt)", "neuroshard", cpu_models)] + \
        [(a, a, cpu_models) for a in GREEDY_ALGORITHMS if a != "random"]
    for name, algorithm, m in searches:
        t0 = time.monotonic()
        plans[name] = search_plan(tables, devices, memory, algorithm=algorithm, cost_models=m, topology=topology)
        search_s[name] = round(time.monotonic() - t0, 2)
    plans[AA_NAME] = plans["size-lookup"]
    print(f"{family}: {len(tables)} tables on {devices} devices, searched in {sum(search_s.values()):.1f} s "
          f"({search_s}); timing on {args.backend} ...", flush=True)
    measuring = gpu_models if gpu_models is not None else cpu_models  # the estimates measure_plans reports
    result = measure_plans(plans, tables, cost_models=measuring, passes=args.passes, backend=args.backend,
                           row_cap=args.row_cap, warmup_passes=1)
    (out / f"measured-{family}.txt").write_text(result.format() + "\n")
    result.write_json(out / f"measured-{family}.json")
    baselines = [p for p in result.plans if p.name in GREEDY_ALGORITHMS]
    best = min(p.max_compute_ms for p in baselines)
    rows = []
    for p in result.plans:
        row = {"family": family, "devices": devices, "tables": len(tables), "plan": p.name,
               "max_compute_ms": round(p.max_compute_ms, 4),
               "ratio_to_best_baseline": round(p.max_compute_ms / best, 4),
               "total_compute_ms": round(float(sum(p.compute_ms)), 4),
               "search_s": search_s.get(p.name)}
        for label, m in models.items():  # each model's prediction of every plan, at the measured batch
            est = Simulator.from_plan(p.plan, m, tables, result.config["batch_size"]).evaluate_plan(p.plan)
            per_device = [float(x) for x in est.compute_ms[0]]
            row[f"{label}_model_est_max_ms"] = round(max(per_device), 4)
            row[f"{label}_model_gmae"] = round(float(estimate_gmae(per_device, p.compute_ms)), 4)
        rows.append(row)
    summary = {"family": family, "devices": devices, "tables": len(tables), "memory_bytes": int(memory),
               "best_baseline": min(baselines, key=lambda p: p.max_compute_ms).name,
               "measure_seconds": result.config["seconds"], "kernel": result.config["kernel"],
               "hardware": result.config["hardware"], "step_seconds": round(time.monotonic() - started, 1),
               "default_model": this_machine_name(default.parent.name) if default else DEFAULT_CHECKPOINT.name,
               "default_is_gpu_model": bool(default and args.gpu_checkpoint and default.samefile(args.gpu_checkpoint)),
               "rows": rows}
    (out / f"plans-{family}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def format_plans(summary: dict) -> list[str]:
    rows = summary["rows"]
    gpu = "GPU_model_est_max_ms" in rows[0]
    lines = [f"plans timed on {summary['hardware']} ({summary['kernel']}): {summary['family']}, {summary['tables']} "
             f"tables on {summary['devices']} devices; measured max device compute, its ratio to the best greedy "
             f"baseline ({summary['best_baseline']}), total compute, and each model's predicted max (GMAE over the "
             f"plan's devices); timing took {summary['measure_seconds']:.0f} s, the step "
             f"{summary['step_seconds']:.0f} s"]
    lines.append(f"  {'plan':<22} {'max ms':>9} {'ratio':>6} {'total ms':>10}"
                 + (f" {'GPU model max':>14} {'gmae':>6}" if gpu else "") + f" {'CPU model max':>14} {'gmae':>6}")
    for r in rows:
        lines.append(f"  {r['plan']:<22} {r['max_compute_ms']:9.3f} {r['ratio_to_best_baseline']:6.3f} "
                     f"{r['total_compute_ms']:10.3f}"
                     + (f" {r['GPU_model_est_max_ms']:14.3f} {100 * r['GPU_model_gmae']:5.1f}%" if gpu else "")
                     + f" {r['CPU_model_est_max_ms']:14.3f} {100 * r['CPU_model_gmae']:5.1f}%")
    by = {r["plan"]: r for r in rows}
    if "size-lookup" in by and AA_NAME in by:
        aa = by[AA_NAME]["max_compute_ms"] / by["size-lookup"]["max_compute_ms"]
        lines.append(f"  A/A: the same size-lookup plan twice, {aa:.3f}x")
    if gpu and "neuroshard (GPU ckpt)" in by:
        r = by["neuroshard (GPU ckpt)"]
        error = 100 * (r["GPU_model_est_max_ms"] / r["max_compute_ms"] - 1)
        lines.append(f"  GPU checkpoint's plan: predicted max {r['GPU_model_est_max_ms']:.3f} ms by its model, "
                     f"measured {r['max_compute_ms']:.3f} ms ({error:+.1f}%)")
    if summary.get("default_model"):
        lines.append(f"  a search with no --cost-model loads {summary['default_model']} here"
                     + (" (the GPU model)" if summary.get("default_is_gpu_model") else ""))
    return lines


# ----------------------------------------------------------------------------------- driver
class Run:
    """The budget, the status of each step and the summary, written after every step."""

    def __init__(self, args: argparse.Namespace, head: list[str]) -> None:
        self.args, self.out = args, args.out
        self.log = args.out / "log.txt"
        self.start = START
        self.summary = list(head)
        self.status: dict[str, dict] = {}
        self.write()

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def note(self, *lines: str) -> None:
        self.summary += lines
        for line in lines:
            print(line, flush=True)
        self.write()

    def record(self, step: str, **fields) -> None:
        self.status[step] = fields
        self.write()

    def skip(self, step: str, why: str) -> None:
        self.record(step, skipped=why)
        self.note(f"{step}: skipped ({why})")

    def write(self) -> None:
        elapsed = time.monotonic() - self.start
        tail = [f"wall so far {elapsed:.0f} s of the {self.args.budget_s:.0f} s budget; step status: "
                + (", ".join(f"{k} {v.get('rc', 'skipped')}" for k, v in self.status.items()) or "none yet")]
        (self.out / "summary.txt").write_text("\n".join(self.summary + tail) + "\n")
        (self.out / "status.json").write_text(json.dumps({"elapsed_s": round(elapsed, 1), "steps": self.status},
                                                         indent=1) + "\n")


def _records(folder: Path) -> int:
    """Shard sets measured in ``folder`` so far, as pretrain will read them (torn lines left out)."""
    return len(store.load_compute_data(folder)) if folder.exists() else 0


def _epochs(text: str, sets: int) -> int:
    if text != "auto":
        return int(text)
    return max(EPOCHS_MIN, min(EPOCHS_MAX, AUTO_SET_EPOCHS // max(sets, 1)))


def machine_folder(out: Path, backend: str) -> Path:
    """This machine's folder of ``pretrain --here --device backend`` under ``out/cache`` (the
    command's ``store.machine_dir`` with ``XDG_CACHE_HOME=out/cache``)."""
    return out / "cache" / store.machine_dir(backend).relative_to(store.cache_root().parent)


def report_lines(folder: Path) -> list[str]:
    """The held-out part of the machine's ``report.txt`` (what was measured, the held-out errors
    per family and model kind, pretrain's table, the stages' seconds); from ``machine.json``'s
    fit when the command ended before writing the report."""
    report = folder / store.MACHINE_REPORT_FILE
    if report.exists():
        lines = report.read_text().splitlines()
        start = next((i for i, ln in enumerate(lines) if ln.startswith("compute:")), len(lines))
        end = next((i for i, ln in enumerate(lines) if ln.startswith("operator costs")), len(lines))
        return [ln for ln in lines[start:end] if ln.strip()] + [ln for ln in lines if ln.startswith("last run:")]
    state = folder / "machine.json"
    fit = (json.loads(state.read_text()).get("fit") or {}) if state.exists() else {}
    if not fit:
        return ["no report.txt and no fit in machine.json (see log.txt)"]
    lines = ["no report.txt (the command ended after its fit: see log.txt); machine.json's fit:"]
    for row in fit.get("families") or []:
        lines.append(f"held-out GMAE, {row['family']} ({row['sets']} sets): " + ", ".join(
            f"{k} {100 * v:.1f}%" for k, v in row.items() if k not in ("family", "sets")))
    return lines + (fit.get("table") or "").splitlines()


def step_here(r: Run, cli: list[str], reserve: float) -> Path | None:
    """``pretrain --here`` as a user runs it, its machine folder under ``--out``; the model it wrote."""
    args = r.args
    limit = min(60.0 * args.here_minutes + HERE_OVER_S, r.left() - reserve)
    if limit < 60:
        r.skip("here", f"{r.left():.0f} s left, {reserve:.0f} s kept for the later steps")
        return None
    cmd = cli + ["pretrain", "--here", "--device", args.backend, "--minutes", f"{args.here_minutes:g}",
                 "--size", args.here_size]
    rc, seconds = run(cmd, r.log, limit, "pretrain --here", env={"XDG_CACHE_HOME": str(r.out / "cache")})
    folder = machine_folder(r.out, args.backend)
    model = folder / store.MACHINE_MODEL_FILE
    made = model.exists()
    r.record("here", rc=rc, ok=made, seconds=round(seconds, 1), limit_s=round(limit), folder=str(folder),
             model=str(model) if made else None)
    r.note(f"here: `neuroshard pretrain --here --device {args.backend} --minutes {args.here_minutes:g} --size "
           f"{args.here_size}`: exit {rc} after {seconds:.0f} s (limit {limit:.0f} s); "
           + (f"model {model}" if made else f"no model in {folder}"),
           *(f"  {ln}" for ln in report_lines(folder)))
    return model if made else None


def step_collect(r: Run, cli: list[str], reserve: float) -> None:
    args = r.args
    folder = r.out / "gpu-compute"
    wall = min(60.0 * args.collect_minutes + COLLECT_OVERHEAD_S, r.left() - reserve)
    timing_s = wall - COLLECT_OVERHEAD_S
    if timing_s < 20:
        return r.skip("collect", f"{r.left():.0f} s left, {reserve:.0f} s kept for the later steps")
    before = _records(folder)
    cmd = cli + ["collect", "compute", str(args.collect_tables), "--device", args.backend,
                 "--samples", str(args.collect_samples), "--max-tables-per-device", str(args.max_tables_per_device),
                 "--memory", "3GiB", "--dims", "4..128", "--row-split-prob", "0.3", "--row-cap", str(args.row_cap),
                 "--seed", "0", "--max-minutes", f"{timing_s / 60:.3f}", "--no-progress", "-o", str(folder)]
    rc, seconds = run(cmd, r.log, wall + 20, "collect compute")
    now = _records(folder)
    rate = (now - before) / max(seconds, 1e-9) * 60
    r.record("collect", rc=rc, seconds=round(seconds, 1), sets=now, new_sets=now - before,
             timing_limit_s=round(timing_s, 1))
    r.note(f"collect: exit {rc} after {seconds:.0f} s (timing limit {timing_s:.0f} s): {now} shard sets in {folder} "
           f"({now - before} new, {rate:.0f} per minute of the step; --max-tables-per-device "
           f"{args.max_tables_per_device}, rows capped at {args.row_cap:,})")


def step_pretrain(r: Run, cli: list[str], reserve: float) -> Path | None:
    args = r.args
    folder, model = r.out / "gpu-compute", r.out / "gpu.pt"
    sets = _records(folder)
    if sets < MIN_SETS:
        r.skip("pretrain", f"{sets} measured sets in {folder}, at least {MIN_SETS} needed")
        return None
    limit = min(args.pretrain_timeout, r.left() - reserve)
    if limit < 20:
        r.skip("pretrain", f"{r.left():.0f} s left, {reserve:.0f} s kept for the later steps")
        return None
    epochs = _epochs(args.epochs, sets)
    cmd = cli + ["pretrain", "--data", str(folder), "--out", str(model), "--epochs", str(epochs), "--seed", "0"]
    log_start = r.log.stat().st_size if r.log.exists() else 0
    rc, seconds = run(cmd, r.log, limit, "pretrain")
    printed = r.log.read_bytes()[log_start:].decode("utf-8", "replace").splitlines()
    wanted = [ln for ln in printed if ln.startswith(("compute", " target", "WARNING", "Error", "neuroshard"))]
    (r.out / "pretrain.txt").write_text("\n".join(printed) + "\n")
    r.record("pretrain", rc=rc, seconds=round(seconds, 1), sets=sets, epochs=epochs,
             checkpoint=str(model) if rc == 0 else None)
    wrote = f" -> {model}" if rc == 0 else ""
    r.note(f"pretrain: exit {rc} after {seconds:.0f} s ({sets} sets, {epochs} epochs){wrote}",
           *(f"  {ln}" for ln in wanted))
    return model if rc == 0 and model.exists() else None


def step_plans(r: Run, gpu_checkpoint: Path | None) -> None:
    args = r.args
    rows = []
    for i, family in enumerate(args.families):
        later = EXPECTED_S["plans"] * (len(args.families) - i - 1)
        limit = min(args.plans_timeout, r.left() - later)
        if limit < 30:  # a later family cannot have this one's time: this one gets what is left
            limit = min(args.plans_timeout, r.left())
        if limit < 30:
            r.skip(f"plans {family}", f"{r.left():.0f} s left")
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--plans-worker", family, "--out", str(r.out),
               "--devices", str(args.devices), "--passes", str(args.passes), "--row-cap", str(args.row_cap),
               "--tables-per-device", *map(str, args.tables_per_device), "--task-seed", str(args.task_seed),
               "--backend", args.backend]
        cmd += ["--gpu-checkpoint", str(gpu_checkpoint)] if gpu_checkpoint else []
        cmd += ["--cpu-checkpoint", str(args.cpu_checkpoint)] if args.cpu_checkpoint else []
        result = r.out / f"plans-{family}.json"
        if result.exists():
            result.unlink()  # a result left by an earlier run must not pass for this one's
        rc, seconds = run(cmd, r.log, limit, f"plans {family}", env={"XDG_CACHE_HOME": str(r.out / "cache")})
        r.record(f"plans {family}", rc=rc, seconds=round(seconds, 1))
        if rc == 0 and result.exists():
            summary = json.loads(result.read_text())
            rows += summary["rows"]
            (r.out / "plans.json").write_text(json.dumps(rows, indent=1) + "\n")
            r.note(*format_plans(summary))
        else:
            r.note(f"plans {family}: exit {rc} after {seconds:.0f} s (see log.txt)")


def step_runtime(r: Run, cli: list[str]) -> None:
    args = r.args
    if r.left() < 120:
        return r.skip("runtime", f"{r.left():.0f} s left")
    out, dist = r.out, "nccl" if args.backend == "cuda" else "gloo"
    t, p = str(out / "tables.json"), str(out / "plan-1gpu.json")
    status = {}
    for name, cmd, limit in (
            ("generate", ["tables", "generate", "--preset", "dlrm-2021", "--num-tables", "16", "--seed", "1",
                          "-o", t], 120),
            ("search", ["search", t, "-d", "1", "-m", "100GiB", "-o", p], 120),
            ("train", ["train", p, "--tables", t, "--dist-backend", dist, "--steps", "10"], 240),
            ("evaluate", ["evaluate", p, "--tables", t, "--dist-backend", dist, "--iterations", "30",
                          "-o", str(out / "evaluate.json")], 240),
            ("estimate", ["estimate", p, "--tables", t, "-o", str(out / "estimate.json")], 120)):
        if r.left() < 20:
            status[name] = "skipped"
            continue
        status[name], _ = run(cli + cmd, r.log, min(limit, r.left()), f"runtime {name}")
    r.record("runtime", rc=0 if all(v == 0 for v in status.values()) else 1, steps=status)
    r.note("runtime: " + ", ".join(f"{k} {v}" for k, v in status.items()))
    if status.get("evaluate") == 0 and status.get("estimate") == 0:
        measured = json.loads((out / "evaluate.json").read_text())
        predicted = json.loads((out / "estimate.json").read_text())
        r.note(f"one-device step: measured {measured.get('iteration_ms')} ms (evaluate, {dist}), "
               f"CPU iteration model's estimate {predicted.get('iteration_ms')} ms",
               *(f"  {term}: measured {measured.get('breakdown', {}).get(term)}, "
                 f"estimated {predicted.get('breakdown', {}).get(term)}"
                 for term in sorted(set(measured.get("breakdown", {})) | set(predicted.get("breakdown", {})))))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", nargs="+", default=list(DEFAULT_STEPS), choices=STEPS,
                        help="steps to run, always in the order here, collect, pretrain, plans, runtime "
                             f"(default: {' '.join(DEFAULT_STEPS)})")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="steps left out of --steps")
    parser.add_argument("--budget-s", type=float, default=510.0,
                        help="wall-clock seconds for the whole run; later steps that cannot fit are skipped "
                             "(default 510)")
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default); cpu only for a dry run of the script on a machine without a GPU")
    g = parser.add_argument_group("H: here")
    g.add_argument("--here-minutes", type=float, default=4.5,
                   help="pretrain --here's --minutes (default 4.5; the step's limit is 90 s more)")
    g.add_argument("--here-size", choices=("default", "tiny"), default="default",
                   help="pretrain --here's --size (tiny: a smoke test, for a dry run)")
    g = parser.add_argument_group("A: collect")
    g.add_argument("--collect-minutes", type=float, default=3.0, help="minutes of timing in collect (default 3)")
    g.add_argument("--collect-samples", "--samples", dest="collect_samples", type=int, default=4000,
                   help="most shard sets collect measures (a cap: the time limit ends it first; default 4000)")
    g.add_argument("--max-tables-per-device", type=int, default=32, help="most shards in a set (default 32)")
    g.add_argument("--collect-tables", type=Path, default=COLLECT_TABLES,
                   help="tables file the sets are drawn from (default: the CPU checkpoint's wide tables)")
    g.add_argument("--row-cap", type=int, default=4_000_000,
                   help="rows allocated at most per shard, in collect and in the plans' timing (default 4,000,000)")
    g = parser.add_argument_group("B: pretrain")
    g.add_argument("--epochs", default="auto", help=f"pretrain's epochs, or auto: {AUTO_SET_EPOCHS:,} / sets "
                                                    f"within [{EPOCHS_MIN}, {EPOCHS_MAX}] (default auto)")
    g.add_argument("--pretrain-timeout", type=float, default=120.0, help="seconds (default 120)")
    g.add_argument("--gpu-checkpoint", type=Path, default=None,
                   help="a GPU checkpoint made before, used by plans when pretrain does not run or fails")
    g = parser.add_argument_group("C: plans")
    g.add_argument("--families", nargs="+", default=["criteo-terabyte", "dlrm-2021"])
    g.add_argument("--devices", type=int, default=8)
    g.add_argument("--tables-per-device", type=int, nargs=2, default=[8, 12], metavar=("LO", "HI"))
    g.add_argument("--task-seed", type=int, default=31)
    g.add_argument("--passes", type=int, default=5, help="timed passes after one warm-up pass (default 5)")
    g.add_argument("--plans-timeout", type=float, default=180.0, help="seconds per family (default 180)")
    g.add_argument("--cpu-checkpoint", type=Path, default=None, help="(default: the shipped checkpoint)")
    parser.add_argument("--plans-worker", default=None, help=argparse.SUPPRESS)  # one family of step C
    args = parser.parse_args(argv)
    if args.epochs != "auto" and not (args.epochs.isdigit() and int(args.epochs) >= 1):
        parser.error(f"--epochs must be auto or a positive integer, got {args.epochs!r}")
    if not 0 < args.here_minutes <= 24 * 60:
        parser.error(f"--here-minutes must be in (0, 1440], got {args.here_minutes:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name in ("out", "collect_tables", "gpu_checkpoint", "cpu_checkpoint"):  # steps run in the repo root
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    if args.plans_worker:
        return plans_worker(args)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    import torch
    if args.backend == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this script is for a GPU machine (--backend cpu: a dry run on the CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_source(args.out)
    steps = [s for s in STEPS if s in args.steps and s not in args.skip]
    device = (f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
              if args.backend == "cuda" else f"device: CPU (dry run), torch {torch.__version__}")
    head = [device, f"fbgemm_gpu: {'yes' if _has_fbgemm() else 'no (kernel: torch.nn.EmbeddingBag)'}",
            f"steps: {' '.join(steps)}; budget {args.budget_s:.0f} s"]
    for line in head:
        print(line, flush=True)
    r = Run(args, head)
    cli = [sys.executable, "-m", "neuroshard.cli"]
    plans_reserve = EXPECTED_S["plans"] * len(args.families) if "plans" in steps else 0
    earlier = machine_folder(args.out, args.backend) / store.MACHINE_MODEL_FILE  # a here step run before
    gpu_checkpoint = args.gpu_checkpoint or (earlier if earlier.exists() else None)
    if "here" in steps:
        later = sum(EXPECTED_S[s] for s in ("collect", "pretrain") if s in steps) + plans_reserve
        gpu_checkpoint = step_here(r, cli, later) or gpu_checkpoint
    if "collect" in steps:
        step_collect(r, cli, (EXPECTED_S["pretrain"] if "pretrain" in steps else 0) + plans_reserve)
    if "pretrain" in steps:
        gpu_checkpoint = step_pretrain(r, cli, plans_reserve) or gpu_checkpoint
    if "plans" in steps:
        r.note(f"plans: GPU model {gpu_checkpoint}" if gpu_checkpoint is not None else
               "plans: no GPU model (here and pretrain made none, no --gpu-checkpoint): NeuroShard is searched "
               "with the CPU checkpoint only")
        step_plans(r, gpu_checkpoint)
    if "runtime" in steps:
        step_runtime(r, cli)
    r.write()
    print(f"summary: {args.out / 'summary.txt'}")
    return 0 if all(v.get("ok", v.get("rc", 0) == 0) for v in r.status.values()) else 1


def _has_fbgemm() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401
        return True
    except Exception:
        return False


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
