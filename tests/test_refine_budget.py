"""The measured loop within a time budget: stages skipped and recorded when they do not fit, the best
plan so far written when the budget ends or the loop is stopped (Ctrl-C, SIGTERM), and its progress."""
from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from neuroshard.costmodels import load_cost_models
from neuroshard.errors import NeuroShardError
from neuroshard.measured.api import measured_search
from neuroshard.measured.budget import EXIT_STOPPED, Budget, format_budget, parse_budget
from neuroshard.measured.calibrate import start_calibration
from neuroshard.measured.config import DEFAULT_CONFIG, default_budget_s
from neuroshard.measured.progress import Progress
from neuroshard.plan import Plan
from neuroshard.tables import Table, TableSet

TABLES = TableSet("budget-hw", [Table(f"t{i}", 2_000 * (i + 1), 16 if i % 2 else 32, 1.0 + 2 * (i % 4),
                                      {"zipf_alpha": 0.9}) for i in range(8)], 4096)


class SlowTimer:
    """A ``DeviceTimer`` whose 'hardware' costs each device's work in ms, and takes ``unit_s`` seconds of
    wall clock per device and pass (its build and sizing counted as one more pass), as a real timer does."""

    def __init__(self, unit_s: float = 0.01):
        self.unit_s, self.calls = unit_s, 0

    def __call__(self, devices, tables, passes=1, **options):
        self.calls += 1
        busy = [d for d in devices if d]
        time.sleep(self.unit_s * len(busy) * (passes + 1))
        by_name = {t.name: t for t in tables}
        times = [[sum(0.02 + 3e-4 * s.num_cols * by_name[s.table].pooling_factor
                      * s.num_rows / by_name[s.table].num_embeddings for s in d)] * passes if d else []
                 for d in devices]
        return times, {"hardware": "slow fake", "kernel": "fake", "passes": passes}


@pytest.fixture(autouse=True)
def fake_greedy(monkeypatch):
    """measured-greedy, one of refine's baselines, times its units with the same slow fake hardware."""
    monkeypatch.setattr("neuroshard.measured.greedy.time_devices", SlowTimer())


def _budgeted(seconds: float, unit_s: float = 0.01, sets: int = 16, devices: int = 2):
    budget = Budget(seconds, Progress("quiet"))
    calibration = start_calibration(TABLES, load_cost_models(), devices=devices, sets=sets, seed=0,
                                    timer=SlowTimer(unit_s), epochs=20, budget=budget)
    return budget, calibration


def test_a_budget_is_seconds_or_a_duration():
    assert parse_budget("300") == parse_budget("5m") == parse_budget("300s") == parse_budget(300) == 300.0
    assert parse_budget("2m30s") == 150.0 and parse_budget("1.5h") == 5400.0 and parse_budget("1 min") == 60.0
    assert math.isinf(parse_budget("none"))
    for bad in ("abc", "0", "-5", "5x", "", "5m abc"):
        with pytest.raises(NeuroShardError, match="budget"):
            parse_budget(bad)
    # the default: RefineConfig's seconds up to its device count, in proportion above
    assert default_budget_s(2) == default_budget_s(8) == DEFAULT_CONFIG.budget_s
    assert default_budget_s(16) == 2 * DEFAULT_CONFIG.budget_s


def test_a_stage_runs_only_when_it_leaves_the_stages_worth_more_their_time():
    clock = [0.0]
    budget = Budget(100.0, clock=lambda: clock[0])
    budget.expect("compare", lambda: 40.0)
    budget.expect("rebalance", lambda: 30.0)
    budget.expect("polish", lambda: 50.0)  # does not fit after the two before it: holds nothing
    assert budget.reserved("calibrate") == 70.0 and budget.room("calibrate") == 30.0
    assert budget.fits("calibrate", 30.0) and not budget.fits("calibrate", 31.0)
    assert budget.reserved("rounds") == 70.0  # polish would not fit after them either
    clock[0] = 50.0
    assert budget.room("compare") == 50.0 and not budget.fits("rebalance", 40.0)
    with budget.stage("compare"):  # a stage running holds nothing against itself
        clock[0] = 60.0
        assert budget.room("compare") == 40.0
    assert budget.record()["stage_s"] == {"compare": 10.0} and budget.record()["wall_s"] == 60.0
    assert Budget(None).fits("rounds", 1e9) and math.isinf(Budget(math.inf).remaining())


def test_refine_with_a_tiny_budget_ends_in_it_and_records_what_it_skipped():
    start = time.monotonic()
    budget, calibration = _budgeted(6.0, unit_s=0.02)
    plan = measured_search(TABLES, devices=2, memory="64MiB", cost_models=load_cost_models(), refine=True,
                           calibration=calibration, budget_s=budget)
    took = time.monotonic() - start
    assert took <= 6.0 + 3.0  # the budget and a grace: no run started whose estimate did not fit
    assert not plan.problems()
    Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).validate()
    record = plan.provenance["refine"]
    assert record["budget_s"] == 6.0 and 0 < record["wall_s"] <= took + 0.5
    assert plan.provenance["search_time_s"] == pytest.approx(record["wall_s"], abs=0.5)  # the whole loop
    assert {"search", "calibrate", "rounds", "candidates"} <= set(record["stage_s"])
    assert all(s >= 0 for s in record["stage_s"].values())
    assert record["skipped"] and all(set(s) == {"stage", "why"} and s["why"] for s in record["skipped"])
    assert "stopped" not in record
    line = format_budget(record)
    assert "of a 6 s budget" in line and "skipped: " in line


def test_refine_with_room_for_everything_skips_nothing():
    budget, calibration = _budgeted(600.0, unit_s=0.0)
    plan = measured_search(TABLES, devices=2, memory="64MiB", cost_models=load_cost_models(), refine=1,
                           calibration=calibration, budget_s=budget)
    record = plan.provenance["refine"]
    assert record["skipped"] == [] and [r["round"] for r in record["rounds"]] == [0, 1]
    assert {"compare", "rebalance", "polish"} <= set(record["stage_s"])
    assert record["against_best_baseline"]["ratio"] > 0
    assert record["chosen"] and not plan.problems()


def test_a_calibration_without_room_leaves_the_plain_search_compared():
    budget = Budget(0.5, Progress("quiet"))
    calibration = start_calibration(TABLES, load_cost_models(), devices=2, sets=16, seed=0, timer=SlowTimer(0.05),
                                    budget=budget)
    assert not calibration.fittable
    assert any(s["stage"] == "calibrate" for s in budget.skipped)


def test_a_keyboard_interrupt_inside_a_stage_returns_the_best_plan_so_far(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt()

    monkeypatch.setattr("neuroshard.measured.refine.polish_and_lean", interrupted)
    budget, calibration = _budgeted(600.0, unit_s=0.0)
    plan = measured_search(TABLES, devices=2, memory="64MiB", cost_models=load_cost_models(), refine=1,
                           calibration=calibration, budget_s=budget)
    record = plan.provenance["refine"]
    assert record["stopped"] == "interrupted" and not plan.problems()
    # the plan the comparison (and the rebalance) kept: what polish started from
    assert record["chosen"] == budget.best_name and plan is budget.best_plan
    assert "polish" in record["stage_s"] and "polish" not in record


def test_a_keyboard_interrupt_while_calibrating_writes_the_plain_search(monkeypatch):
    calls = []

    def interrupted(self, sets, kind, passes=1):
        calls.append(kind)
        raise KeyboardInterrupt()

    monkeypatch.setattr("neuroshard.measured.calibrate.Calibration.add", interrupted)
    plan = measured_search(TABLES, devices=2, memory="64MiB", cost_models=load_cost_models(), refine=1, budget_s=60,
                           progress="quiet")
    record = plan.provenance["refine"]
    assert calls and record["stopped"] == "interrupted" and record["chosen"] == "neuroshard-pretrained"
    assert plan.provenance["algorithm"] == "neuroshard" and not plan.problems()
    plain = measured_search(TABLES, devices=2, memory="64MiB", cost_models=load_cost_models())
    assert plan.layout_key() == plain.layout_key()  # the plain search's plan: nothing was timed


def test_budget_needs_refine():
    with pytest.raises(NeuroShardError, match="needs refine"):
        measured_search(TABLES, devices=2, memory="64MiB", cost_models=load_cost_models(), budget_s=60)


def test_progress_is_one_line_per_change_in_a_log_and_nothing_when_quiet():
    stream = io.StringIO()
    progress = Progress("lines", stream)
    progress.deadline = time.monotonic() + 100
    progress.update(stage="calibrate", what="random sets", done=0, total=32)
    progress.update(what="random sets", done=16, total=32)  # only a count moved, seconds ago: no line
    progress.best(0.962, "size-lookup")
    progress.update(stage="compare", what="timing 6 plans together")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("refine: calibrate: random sets 0/32 | ") and lines[0].endswith(" s left")
    assert "best 0.962x size-lookup" in lines[-1] and "compare: timing 6 plans together" in lines[-1]
    assert len(lines) == 3
    quiet = io.StringIO()
    silent = Progress("quiet", quiet)
    silent.update(stage="calibrate", what="x", done=1, total=2)
    silent.note("skipped")
    assert quiet.getvalue() == ""


@pytest.mark.timing
@pytest.mark.timeout(600)
def test_sigterm_stops_search_refine_which_writes_the_best_plan_and_says_so(tmp_path):
    """SIGTERM to `search --refine`: the plan so far is written and the exit status is 143 (128 + SIGTERM)."""
    TABLES.write(tmp_path / "t.json")
    out = tmp_path / "p.json"
    proc = subprocess.Popen([sys.executable, "-m", "neuroshard.cli", "search", str(tmp_path / "t.json"), "-d", "2",
                             "-m", "64MiB", "--refine", "--budget", "10m", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        seen = []
        for line in proc.stderr:  # progress as plain lines (not a terminal)
            seen.append(line)
            if line.startswith("refine: calibrate"):
                break
        assert seen and seen[-1].startswith("refine: calibrate"), "".join(seen)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_STOPPED["terminated"] == 143, stderr
    record = Plan.read(out).validate().provenance["refine"]
    assert record["stopped"] == "terminated" and record["wall_s"] > 0
    assert "terminated before the end: the best plan so far written" in stdout


@pytest.mark.timing
@pytest.mark.timeout(600)
def test_search_refine_with_a_tiny_budget_on_real_kernels_returns_in_it(tmp_path):
    TABLES.write(tmp_path / "t.json")
    out = tmp_path / "p.json"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "neuroshard.cli", "search", str(tmp_path / "t.json"), "-d", "2",
                           "-m", "64MiB", "--refine", "--budget", "20", "-q", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # -q: no progress
    record = Plan.read(out).validate().provenance["refine"]
    assert record["budget_s"] == 20.0 and record["wall_s"] <= 20.0 + 15.0  # one run's misestimate at most
    assert took <= record["wall_s"] + 30  # the process: start-up and writing besides the loop
    assert "refine: " in proc.stdout and "of a 20 s budget" in proc.stdout
    assert f"searched in {Plan.read(out).provenance['search_time_s']:.2f} s" in proc.stdout
