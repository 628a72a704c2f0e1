"""``RuntimeJudge``: refine's final choice made by training the plans on the included runtime.

``neuroshard measure``'s protocol (refine's instrument) times each device's tables in the
fused kernel with the caches flushed; training keeps a device's hot rows warm from one step
to the next and pays the backward pass and the all-to-all too. The two rank close plans
differently (the demo, 2026-11-27, Intel Xeon: the plan the kernel measured cheapest ran
2.8% slower than lookup's on this runtime, A/A 0.2%). This judge measures what the demo
and a user training here compare: each plan's slowest device (embedding compute, forward
and backward communication: ``Measurement.max_device_cost_ms``) over ``runs`` runs where
all plans take turns of a few steps (``evaluate.measure_alternating``), one process per device.
"""
from __future__ import annotations

from ..measured.judge import PlanJudge
from ..plan import Plan
from ..tables import TableSet
from ..validate import check_int
from .evaluate import measure_alternating

#: runs of the judgement (the order of the plans rotates from run to run) and measured steps
#: per plan and run: the demo's own comparison (3 runs of 12 steps) measured an A/A of 0.1-5%
JUDGE_RUNS = 3
JUDGE_ITERATIONS = 12


class RuntimeJudge(PlanJudge):
    """Trains the plans together on the included runtime (gloo processes on CPU, one per
    device); a plan's cost in a run is its slowest device's median embedding cost.
    ``batch_size``: the tables' when None."""

    name = "runtime"

    def __init__(self, runs: int = JUDGE_RUNS, iterations: int = JUDGE_ITERATIONS, batch_size: int | None = None):
        self.runs = check_int(runs, "judge runs", 1, 100)
        self.iterations = check_int(iterations, "judge iterations", 1, 10_000)
        self.batch_size = batch_size

    def costs_ms(self, plans: list[Plan], tables: TableSet) -> list[list[float]]:
        named = {f"plan {k}": plan for k, plan in enumerate(plans)}
        options = {} if self.batch_size is None else {"batch_size": self.batch_size}
        runs = measure_alternating(named, tables, runs=self.runs, iterations=self.iterations,
                                   devices=max(p.num_devices for p in plans), **options)
        return [[m.max_device_cost_ms for m in runs[name]] for name in named]
