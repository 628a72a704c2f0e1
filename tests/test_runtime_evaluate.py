"""`neuroshard evaluate` measures each device; `neuroshard train` runs under torchrun too."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuroshard.costmodels.samples.kernel import KernelBenchmark
from neuroshard.errors import NeuroShardError
from neuroshard.execution.launch import free_port
from neuroshard.plan import Plan, Shard
from neuroshard.runtime.evaluate import (
    evaluate,
    evaluate_together,
    measure_alternating,
    measure_paired,
    paired_improvement,
    paired_window_steps,
    settled_steps,
    steps_per_plan,
)
from neuroshard.runtime.trainer import RunConfig, run
from neuroshard.tables import Table, TableSet

TABLES = [Table("big", 50_000, 16, 2.0, {"zipf_alpha": 1.05}), Table("a", 300, 8, 1.0),
          Table("b", 400, 16, 3.0), Table("c", 200, 8, 1.0)]


def _files(tmp_path: Path) -> None:
    TableSet("evaluate", TABLES, 64).write(tmp_path / "tables.json")
    shards = [Shard("big", 0, 25_000, 0, 16, 0), Shard("big", 25_000, 25_000, 0, 16, 1),
              Shard("a", 0, 300, 0, 8, 1), Shard("b", 0, 400, 0, 8, 0), Shard("b", 0, 400, 8, 8, 1),
              Shard("c", 0, 200, 0, 8, 0)]
    Plan(TABLES, shards, 2, 10**9, tables_name="evaluate",
         estimate={"max_device_cost_ms": 1.5, "per_device_cost_ms": [1.5, 1.2]}).write(tmp_path / "plan.json")


@pytest.mark.timing
@pytest.mark.gloo
def test_evaluate_reports_per_device_costs(tmp_path):
    _files(tmp_path)
    out = subprocess.run([sys.executable, "-m", "neuroshard.cli", "evaluate", "--plan", "plan.json",
                          "--tables", "tables.json", "--iterations", "5", "--warmup", "2", "--row-cap", "10000",
                          "--json", "m.json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    # one line for the plan's capped shards, not one per shard or per rank
    assert out.stderr.count("allocate at most 10,000 rows (row cap") == 1, out.stderr
    assert "2 shard(s) allocate at most 10,000 rows (row cap" in out.stderr
    assert "'big' rows [25,000, 50,000) on device 1" in out.stderr
    assert "max device cost" in out.stdout and "1.500 ms estimated" in out.stdout
    m = json.loads((tmp_path / "m.json").read_text())
    assert (m["num_devices"], m["iterations"], m["warmup"], m["backend"]) == (2, 5, 2, "gloo")
    assert m["clock"] == "thread" and m["kernel"] in ("fbgemm_tbe", "embedding_bag")
    assert [d["device"] for d in m["per_device"]] == [0, 1]
    for d in m["per_device"]:
        assert all(d[k] > 0 for k in ("compute_ms", "fwd_comm_ms", "bwd_comm_ms", "total_ms"))
    assert m["per_device_cost_ms"] == [d["total_ms"] for d in m["per_device"]]
    assert m["max_device_cost_ms"] == max(m["per_device_cost_ms"])
    assert m["iterations_per_s"] > 0


@pytest.mark.gloo
def test_train_under_torchrun(tmp_path):
    _files(tmp_path)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", str(free_port()),
                          "-m", "neuroshard.cli", "train", "--plan", "plan.json", "--tables", "tables.json",
                          "--steps", "3", "--timeout", "60"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("trained 3 steps on 2 devices (gloo)") == 1  # rank 0 reports, once
    assert "step     2  loss" in out.stdout


@pytest.mark.timing
@pytest.mark.gloo
def test_runtime_runs_the_kernel_the_measurement_picks(tmp_path):
    """`auto` means the same kernel in training as in the kernel benchmark, timed on the same clock."""
    _files(tmp_path)
    bench = KernelBenchmark(kernel="auto")
    m = evaluate(Plan.read(tmp_path / "plan.json"), TableSet.read(tmp_path / "tables.json"), iterations=2, warmup=1,
                 kernel="auto", timeout_s=60)
    assert (m.kernel, m.clock) == (bench.kernel, bench.clock) == (bench.kernel, "thread")
    for d in m.per_device:
        assert d["compute_ms"] > 0 and d["compute_wall_ms"] > 0


def test_paired_improvement_is_the_geometric_mean_of_round_ratios():
    assert paired_improvement([90.0, 45.0], [100.0, 50.0]) == pytest.approx(0.10)
    # a slow spell that hits both plans of a round does not change the result
    assert paired_improvement([90.0, 180.0], [100.0, 200.0]) == pytest.approx(0.10)
    assert paired_improvement([110.0], [100.0]) == pytest.approx(-0.10)


def test_turns_leave_enough_settled_steps_and_a_turn_of_one_step_is_refused():
    """Every plan gets ``iterations`` settled steps after warm-up, in whole turns; alone, no turn."""
    from neuroshard.runtime.trainer import check_config
    assert steps_per_plan(12, 3, 1) == 15
    for iterations, warmup, turn in ((12, 3, 3), (3, 1, 2), (1, 0, 2), (5, 4, 4)):
        steps = steps_per_plan(iterations, warmup, 3, turn)
        assert steps % turn == 0
        kept = sum(1 for k in range(steps) if k >= warmup and k % turn != 0)
        assert kept >= iterations and kept - iterations < turn
    plan = Plan(TABLES, [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, 0) for t in TABLES], 2, 10**9)
    with pytest.raises(NeuroShardError, match="steps per turn"):
        check_config(RunConfig(plan, TABLES, 2, alternates=[plan], turn=1))
    check_config(RunConfig(plan, TABLES, 2, turn=1))  # one plan: every step follows its own
    with pytest.raises(NeuroShardError, match="steps per turn"):  # refused before the steps are counted
        evaluate_together([plan, plan], TableSet("t", TABLES, 64), iterations=2, turn=1)


@pytest.mark.timing
@pytest.mark.gloo
def test_plans_measured_together_alternate_their_steps(tmp_path):
    """An A/B run: both plans' embeddings live in every rank and they take turns of a few steps;
    a turn's first step (its barrier waits for the other plan's ranks) is not measured."""
    _files(tmp_path)
    tables = TableSet.read(tmp_path / "tables.json")
    split = Plan.read(tmp_path / "plan.json")
    whole = Plan(TABLES, [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % 2) for i, t in enumerate(TABLES)],
                 2, 10**9, tables_name="evaluate")
    result = run(RunConfig(split, TABLES, 2, steps=8, batch_size=64, alternates=[whole], turn=2))
    assert [r["plan"] for r in result.records[0]] == [0, 0, 1, 1, 0, 0, 1, 1]
    # plan 1's first steps: its switch steps at 2 and 6 are left out, one warm-up step too
    assert settled_steps(result.records[0], 1, 1) == [result.records[0][i] for i in (3, 7)]
    assert settled_steps(result.records[0], 0, 0) == [result.records[0][i] for i in (0, 1, 5)]
    first, second = evaluate_together([split, whole], tables, iterations=3, warmup=1)
    assert first.plan is split and second.plan is whole
    assert first.iterations == second.iterations == 3 and first.warmup == 1
    assert [d["shards"] for d in first.per_device] == [3, 3] and [d["shards"] for d in second.per_device] == [2, 2]
    runs = measure_alternating({"split": split, "whole": whole}, tables, runs=2, iterations=2)
    assert [len(v) for v in runs.values()] == [2, 2]
    assert all(m.plan is whole for m in runs["whole"])


@pytest.mark.timing
@pytest.mark.gloo
def test_paired_runs_hold_two_plans_and_pair_each_with_the_first(tmp_path):
    """``measure_paired``: one launch; the first plan beside each other in a window of its own, the
    window's alternate built in its first steps and freed after them (two plans held at most), each
    window cut into runs that pair the two on the same steps; costs on the first plan's scale."""
    _files(tmp_path)
    tables = TableSet.read(tmp_path / "tables.json")
    split = Plan.read(tmp_path / "plan.json")
    whole = Plan(TABLES, [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, i % 2) for i, t in enumerate(TABLES)],
                 2, 10**9, tables_name="evaluate")
    result = run(RunConfig(split, TABLES, 2, steps=16, batch_size=64, alternates=[whole, split], turn=2, paired=True))
    assert [r["plan"] for r in result.records[0]] == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 2, 2, 0, 0, 2, 2]
    assert sorted((m.plan, m.rank) for m in result.memory) == [(p, r) for p in range(3) for r in range(2)]
    assert all(m.device_bytes > 0 for m in result.memory)
    assert paired_window_steps(2, 3, 3) == [6, 3, 3]  # runs after the first start on a switch step
    paired = measure_paired({"split": split, "whole": whole, "again": split}, tables, runs=2, iterations=2,
                            progress="lines", progress_prefix="test")
    assert paired.names == ["split", "whole", "again"]
    assert all(len(pairs) == 2 for pairs in paired.beside.values())
    assert all(m.plan is whole and m.iterations == 2 for m in paired.measurements("whole"))
    assert all(m.plan is split for m in paired.measurements("split", beside="whole"))
    costs = paired.costs_ms()
    assert [len(c) for c in costs.values()] == [2, 2, 2]
    for r, (mine, own) in enumerate(paired.beside["whole"]):  # the pairs' ratios, exactly
        assert costs["whole"][r] / costs["split"][r] == pytest.approx(own.max_device_cost_ms / mine.max_device_cost_ms)
    with pytest.raises(NeuroShardError, match="at least two"):
        measure_paired({"split": split}, tables)


@pytest.mark.timing
@pytest.mark.gloo
def test_runtime_judge_trains_the_plans_together_and_ranks_a_lopsided_plan_last():
    """``RuntimeJudge`` (refine's final judge on the runtime): every plan in every run, a plan's
    cost its slowest device's; two heavy tables on one device cost more than one on each."""
    from neuroshard.measured.judge import geometric_mean
    from neuroshard.runtime.judge import RuntimeJudge
    heavy = [Table("x", 100_000, 64, 20.0), Table("y", 100_000, 64, 20.0), Table("z", 100, 8, 1.0)]
    tables = TableSet("judge", heavy, 1024)
    spread = Plan(heavy, [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, d) for t, d in zip(heavy, (0, 1, 1))],
                  2, 10**9, tables_name="judge")
    lopsided = Plan(heavy, [Shard(t.name, 0, t.num_embeddings, 0, t.embedding_dim, d)
                            for t, d in zip(heavy, (0, 0, 1))], 2, 10**9, tables_name="judge")
    judge = RuntimeJudge(runs=2, iterations=6)
    assert judge.describe() == {"name": "runtime", "runs": 2, "iterations": 6, "batch_size": None}
    costs = judge.costs_ms([spread, lopsided], tables)
    assert [len(c) for c in costs] == [2, 2] and all(c > 0 for run in costs for c in run)
    assert geometric_mean(costs[0]) < geometric_mean(costs[1])
    with pytest.raises(Exception, match="judge runs must be"):
        RuntimeJudge(runs=0)
