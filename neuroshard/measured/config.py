"""The measured loop's tuned constants, in one place: ``RefineConfig``.

Every stage of refine (``measured.refine`` lists them) reads its numbers from a
``RefineConfig``; ``DEFAULT_CONFIG`` is the one the package runs with. The evidence for each
value is in ``docs/decisions.md`` under the anchor its line names.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..constants import TIMING_PASSES, TIMING_REPEATS

# How the loop times things, in four words (``costmodels.samples.timing`` is the instrument):
# - a *repeat* is one timed run of a kernel inside a measurement: a kernel benchmark times each
#   shard set KERNEL_REPEATS times at least (constants.py); an interleaved timing run times each
#   device TIMING_REPEATS times at least per pass (more for a short device), the pass's figure
#   their median. COMPARE_REPEATS (``compare_repeats``): the repeats when whole plans are compared.
# - a *pass* is one turn of every device set of an interleaved timing run; a device's figure in
#   the run is made from its passes: TIMING_PASSES for ``measure`` and calibration,
#   REFINE_PASSES (``refine_passes``) when a round's plan is timed, COMPARE_PASSES
#   (``compare_passes``) when whole plans are compared.
# - a *run* is one interleaved timing run: every device of every plan compared, timed together
#   (the machine's speed drifts between runs, not within one). FINALIST_RUNS (``finalist_runs``):
#   the finalists' runs, each device's median over them deciding; FINAL_CHECK_RUNS
#   (``final_check_runs``): the runs of a final check, a lean choice, a rebalance round or a
#   confirmation, each device's mean over them deciding.
# - a *round* is one search-time-fine-tune cycle of refine (``rounds``); a *rebalance round*
#   (``rebalance_rounds``) is one fit of marginal costs, its rebalanced plans and their run(s).


@dataclass(frozen=True)
class RefineConfig:
    """The tuned constants of refine, its rebalance and its polish, one line of meaning each."""

    # ------------------------------------------------------------ rounds (measured.rounds)
    #: refine rounds when none are stated (``search --refine`` alone, ``refine=True``)
    rounds: int = 2
    #: passes per device set when a round's plan is timed
    refine_passes: int = 3

    # ------------------------------------------------------------ the choice (measured.choice)
    #: passes when whole plans are compared: ``measure``'s protocol (docs/decisions.md#timing-passes)
    compare_passes: int = TIMING_PASSES
    #: repeats per device and pass when whole plans are compared
    compare_repeats: int = TIMING_REPEATS
    #: plans within this fraction of the cheapest are finalists, timed again (docs/decisions.md#refine-finalists)
    finalist_margin: float = 0.08
    #: ... and, whatever the margin, the cheapest this many
    min_finalists: int = 4
    #: ... and at most this many of them, the cheapest first
    max_finalists: int = 6
    #: the finalists' runs in all (the comparison run included), each device's median deciding
    finalist_runs: int = 3
    #: costs within this fraction of the cheapest tie, and less total compute wins (docs/decisions.md#tie-margin)
    tie_margin: float = 0.01
    #: total compute beyond (1 + this) x the run's least scales a cost; None: unpriced (docs/decisions.md#work-priced)
    work_allowance: float | None = 0.02
    #: the plan of least total compute within this of the cheapest is polished too (docs/decisions.md#lean-plan)
    lean_margin: float = 0.20
    #: ... when it saves at least this fraction of the chosen plan's total compute (so is a least-work rebalance start)
    lean_saving: float = 0.01
    #: runs of a final check, a lean choice, a rebalance round or a confirmation, each device's mean deciding
    final_check_runs: int = 2

    # ------------------------------------------------------------ rebalance (measured.rebalance)
    #: rebalance rounds at most: each fits marginal costs, rebalances and times (docs/decisions.md#rebalance)
    rebalance_rounds: int = 3
    #: a rebalance change is made when the estimated slowest device drops by this fraction at least
    rebalance_min_gain: float = 0.003
    #: at most this many rebalance changes per device
    rebalance_steps_per_device: int = 3
    #: a rebalance of more changes is also timed cut after this many (the estimate errs with their number)
    rebalance_short: int = 2
    #: the ridge on each table's fitted factor around the shared factor, in units of a device's relative error
    marginal_ridge: float = 1.0
    #: a table's fitted factor stays within this range of the shared factor
    factor_range: tuple[float, float] = (0.5, 2.0)
    #: an even repack is timed when its fitted cost is at most this fraction above the plan's
    even_slack: float = 0.05
    #: packings of each start cut and repacked (randomised LPT variants; docs/decisions.md#rebalance)
    split_repack_variants: int = 6
    #: the log-normal sigma of a randomised packing's keys
    split_repack_spread: float = 0.15

    # ------------------------------------------------------------ polish (measured.polish)
    #: polish's measured steps at least ...
    polish_steps: int = 12
    #: ... and this many per device
    polish_steps_per_device: int = 2
    #: a change must gain this fraction of the plan's objective (predicted, then measured) to be tried, then kept
    polish_min_gain: float = 0.005
    #: polish's objective: the mean of the slowest this many devices (docs/decisions.md#polish-slowest-device)
    polish_top: int = 1

    # ------------------------------------------------------------ the budget (measured.budget)
    #: the whole measured loop's wall-clock seconds when none are given, calibration included, up to ...
    budget_s: float = 300.0
    #: ... this many devices; above, budget_s x devices / budget_devices (docs/decisions.md#refine-budget)
    budget_devices: int = 8
    #: calibration's share of the budget at most: its random sets are as many as fit in it
    calibration_share: float = 0.3
    #: sets timed in one calibration run under a budget (the deadline is checked between runs)
    calibration_chunk: int = 16
    #: seconds one set timed in one pass is guessed to take (build and sizing included) before any is timed
    unit_prior_s: float = 0.5
    #: seconds fine-tuning takes per measured set, guessed before one is timed (2-core CPU: 0.2-0.3)
    fine_tune_prior_s: float = 0.3
    #: seconds one plan takes in one run of a judge of whole plans (the runtime's), guessed before it runs
    judge_plan_run_s: float = 12.0  # the runtime judge, 2 processes, the demo's tables: about 12 s
    #: plans the comparison's estimate counts on: the plain search's and one more (more are timed when the
    #: rebalance's estimate fits beside them)
    budget_compare_plans: int = 2
    #: rebalanced plans the rebalance's estimate counts on (a round times more when they fit)
    budget_rebalance_plans: int = 4
    #: polish steps the polish's and the lean plan's estimates count on (more are timed while they fit)
    budget_polish_steps: int = 4
    #: the stages by measured gain per second, first the most: a stage runs only when its estimated
    #: cost leaves the estimates of the stages before it in this order (docs/decisions.md#refine-budget)
    stage_priority: tuple[str, ...] = ("compare", "rebalance", "calibrate", "polish", "measured-greedy", "lean",
                                       "rebalance-more", "finalists", "rounds")


#: the configuration the package runs with
DEFAULT_CONFIG = RefineConfig()


#: the demo's measured loop, calibration included (s): with its runtime comparison after it, the demo
#: ends within about 5 minutes on 2 cores
DEMO_BUDGET_S = 120.0
#: the wall clock the demo is sized for on 2 cores (s): refine's ``DEMO_BUDGET_S``, the runtime
#: comparison's ``DEMO_RUNS`` x ``DEMO_ITERATIONS`` (about two minutes), the rest under a minute
DEMO_TARGET_S = 300.0
#: the demo comparison's runs and measured iterations per plan and run (each plan's window beside
#: ours: ``runtime.evaluate.measure_paired``); also refine's runtime judge's in the demo
DEMO_RUNS = 2
DEMO_ITERATIONS = 4


def default_budget_s(devices: int, config: RefineConfig = DEFAULT_CONFIG) -> float:
    """The measured loop's default budget (s) for a task of ``devices``: ``budget_s`` up to
    ``budget_devices`` devices, growing in proportion with the devices above."""
    return config.budget_s * max(1.0, devices / config.budget_devices)


__all__ = ["RefineConfig", "DEFAULT_CONFIG", "DEMO_BUDGET_S", "DEMO_TARGET_S", "DEMO_RUNS", "DEMO_ITERATIONS",
           "default_budget_s"]
