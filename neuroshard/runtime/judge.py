"""``RuntimeJudge``: refine's final choice made by training the plans on the included runtime.

``neuroshard measure``'s protocol (refine's instrument) times each device's tables in the
fused kernel with the caches flushed; training keeps a device's hot rows warm from one step
to the next and pays the backward pass and the all-to-all too. The two rank close plans
differently (the demo, 2026-11-27, Intel Xeon: the plan the kernel measured cheapest ran
2.8% slower than lookup's on this runtime, A/A 0.2%). This judge measures what the demo
and a user training here compare: each plan's slowest device (embedding compute, forward
and backward communication: ``Measurement.max_device_cost_ms``) over ``runs`` runs, one process
per device: the first plan beside each other in turns of a few steps, two plans' embeddings held
at a time (``evaluate.measure_paired``; docs/decisions.md#runtime-judge).
"""
from __future__ import annotations

from ..measured.judge import PlanJudge
from ..plan import Plan
from ..tables import TableSet
from ..validate import check_int
from .evaluate import measure_paired

#: runs of the judgement (each a stretch of every plan's window beside the first) and measured
#: steps per plan and run: the demo's own comparison (3 runs of 12 steps) measured an A/A of 0.1-5%
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
        """Per plan, its cost per run on the first plan's scale (``PairedRuns.costs_ms``): its ratio
        to the first plan in the steps they shared."""
        named = {f"plan {k}": plan for k, plan in enumerate(plans)}
        options = {} if self.batch_size is None else {"batch_size": self.batch_size}
        runs = measure_paired(named, tables, runs=self.runs, iterations=self.iterations,
                              devices=max(p.num_devices for p in plans), **options).costs_ms()
        return [runs[name] for name in named]
