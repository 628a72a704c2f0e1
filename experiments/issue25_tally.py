"""Issue 25's targets over every plan-benchmark run with the reference instrument.

    python experiments/issue25_tally.py

Reads the ``tasks.csv`` of each run in ``RUNS`` (``plan_benchmark.py --one-host --calibrate
--refine-rounds 1``, timed with ``measure``'s reference device: sessions 18-25), keeps each
task's most recent run (a task is its family, device count, tables and memory: a task timed
again after a change counts once, as last measured), and prints per device count the
geometric mean and worst of ``--refine``'s and plain ``search``'s max device over the best
baseline's, the calibrated search's, the A/A control's (and how many tasks' A/A is more than
``AA_BROKEN`` from 1), and refine's total work over the least of the baselines' (with its noise: the
mean absolute log ratio of the A/A control's total work to its twin's): the figures
issue 25's "Done when" names. Then the same over ``RUNS_ANY``, our searches with
``--row-blocks any``, and where a run also timed the plain search with TorchRec's layouts
(session 27 on), its ratio and the plain search's over it, paired by task; and last the runs of
``RUNS_ANY`` timed in huge pages (``RUNS_HUGE_PAGES``, session 28 on) alone.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

RESULTS = Path(__file__).resolve().parent / "results"
#: oldest first: a later run of the same task replaces an earlier one
RUNS = ["plan_benchmark_issue25_session18", "plan_benchmark_issue25_session19_8dev",
        "plan_benchmark_issue25_session21_8dev", "plan_benchmark_issue25_session22",
        "plan_benchmark_issue25_session23_8dev", "plan_benchmark_issue25_session23_8dev_seed153",
        "plan_benchmark_issue25_session23_16dev", "plan_benchmark_issue25_session23_16dev_kaggle",
        "plan_benchmark_issue25_session24_8dev_seed153", "plan_benchmark_issue25_session24_8dev_seed155",
        "plan_benchmark_issue25_session24_4dev_seed155", "plan_benchmark_issue25_session24_16dev_seed157",
        "plan_benchmark_issue25_session24_8dev_seed157", "plan_benchmark_issue25_session24_4dev_seed157",
        "plan_benchmark_issue25_session25_8dev_seed159", "plan_benchmark_issue25_session25_8dev_seed159_again",
        "plan_benchmark_issue25_session25_8dev_seed161",
        "plan_benchmark_issue25_session25_4dev_seed161"]
#: our searches with ``--row-blocks any`` (session 26 on): row splits TorchRec does not run, a mode of
#: its own (the runs above are TorchRec's layouts), tallied apart
RUNS_ANY = ["plan_benchmark_issue25_session26_8dev_seed163_any", "plan_benchmark_issue25_session26_8dev_seed163_any_again",
            "plan_benchmark_issue25_session26_4dev_seed163_any", "plan_benchmark_issue25_session26_8dev_seed165_any",
            "plan_benchmark_issue25_session26_16dev_seed163_any", "plan_benchmark_issue25_session26_16dev_seed163_any_dlrm",
            "plan_benchmark_issue25_session27_4dev_seed167_any", "plan_benchmark_issue25_session27_8dev_seed167_any",
            "plan_benchmark_issue25_session27_8dev_seed167_any_dlrm",
            "plan_benchmark_issue25_session28_8dev_seed167_any_thp", "plan_benchmark_issue25_session28_8dev_seed169_any",
            "plan_benchmark_issue25_session29_8dev_seed169_work",
            "plan_benchmark_issue25_session30_4dev_seed163_any_thp", "plan_benchmark_issue25_session30_16dev_seed163_any_thp",
            "plan_benchmark_issue25_session30_8dev_seed173_any", "plan_benchmark_issue25_session30_8dev_seed169_lean",
            # session 31 (fresh tasks, seed 179); its seed-169 run measured code since reverted and is left out
            "plan_benchmark_issue25_session31_8dev_seed179", "plan_benchmark_issue25_session31_8dev_seed179_dlrm",
            # session 32: refine rebalances on marginal costs fitted to its timing runs. The first seed-169 run had
            # the rebalance inert (a bug: no candidate), the second one round of it, as the dlrm-2021 seed-181 run;
            # the later runs up to three rounds
            "plan_benchmark_issue25_session32_8dev_seed169", "plan_benchmark_issue25_session32_8dev_seed169_rebalanced",
            "plan_benchmark_issue25_session32_8dev_seed181_dlrm", "plan_benchmark_issue25_session32_8dev_seed181",
            "plan_benchmark_issue25_session32_8dev_seed183_dlrm",
            # session 34: seed 185's criteo-terabyte ran session 33's code (the cut rebalance); the later runs add the
            # noise-shrunk anchors and the repacked plan (formats revision 27)
            "plan_benchmark_issue25_session34_8dev_seed185", "plan_benchmark_issue25_session34_8dev_seed185_dlrm",
            "plan_benchmark_issue25_session34_8dev_seed183",
            # the rebalanced plan confirmed in fresh runs as well
            "plan_benchmark_issue25_session34_8dev_seed187", "plan_benchmark_issue25_session34_8dev_seed187_dlrm",
            "plan_benchmark_issue25_session34_8dev_seed189_dlrm",
            # session 35 (AMD EPYC model 17, a CPU the shipped checkpoint is 148% off on before calibration)
            "plan_benchmark_issue25_session35_16dev_seed191", "plan_benchmark_issue25_session35_16dev_seed191_dlrm",
            "plan_benchmark_issue25_session35_4dev_seed191", "plan_benchmark_issue25_session35_4dev_seed191_dlrm",
            # session 36 (AMD EPYC model 17): a tie on the slowest device goes to less total work (formats revision 28)
            "plan_benchmark_issue25_session36_8dev_seed193", "plan_benchmark_issue25_session36_8dev_seed193_dlrm",
            "plan_benchmark_issue25_session36_4dev_seed193", "plan_benchmark_issue25_session36_4dev_seed193_dlrm",
            "plan_benchmark_issue25_session36_4dev_seed195", "plan_benchmark_issue25_session36_4dev_seed195_dlrm",
            "plan_benchmark_issue25_session36_8dev_seed195", "plan_benchmark_issue25_session36_8dev_seed195_dlrm",
            # session 37: refine also repacks the chosen plan evenly (e4e4cf0); then (the seed-201 criteo-terabyte
            # task again, twice: its later runs replace the first) also cuts each start's hottest table into row
            # blocks (split_hot, fad7cb0 and f12babd; the first of those runs had split_hot refuse the lean plan's
            # TorchRec layout, the second the code as committed). Formats revision 29
            "plan_benchmark_issue25_session37_4dev_seed199", "plan_benchmark_issue25_session37_4dev_seed199_dlrm",
            "plan_benchmark_issue25_session37_4dev_seed201", "plan_benchmark_issue25_session37_4dev_seed201_dlrm",
            "plan_benchmark_issue25_session37_4dev_seed201_split", "plan_benchmark_issue25_session37_4dev_seed201_split2",
            "plan_benchmark_issue25_session37_8dev_seed203",
            # session 38: each start's hottest table cut and repacked (split_hot(..., repack=True), three packings from
            # the second seed-201 run on) and a tie in the rebalance rounds going to less total work (the seed-205 runs
            # on). Formats revision 30. The seed-201 criteo-terabyte task again, twice (the later run replaces the first)
            "plan_benchmark_issue25_session38_4dev_seed201", "plan_benchmark_issue25_session38_4dev_seed201_variants",
            "plan_benchmark_issue25_session38_4dev_seed205", "plan_benchmark_issue25_session38_4dev_seed207",
            # and three tasks of earlier sessions again with this code: the 8-device worst task (seed 187, session 34),
            # the 4-device task of most total work (seed 199, session 37) and then the 8-device worst (dlrm seed 179)
            "plan_benchmark_issue25_session38_8dev_seed187", "plan_benchmark_issue25_session38_4dev_seed199",
            "plan_benchmark_issue25_session38_8dev_seed179_dlrm",
            # session 39: total work priced (WORK_ALLOWANCE 0.02) and the comparison run's least-work plan a rebalance
            # start and the reference of every rebalance run (formats revision 31): the 4-device tasks of most total
            # work again, the oldest first run with code of sessions 27-36
            "plan_benchmark_issue25_session39_4dev_seed199", "plan_benchmark_issue25_session39_4dev_seed201",
            "plan_benchmark_issue25_session39_4dev_seed163", "plan_benchmark_issue25_session39_4dev_seed191",
            "plan_benchmark_issue25_session39_4dev_seed195", "plan_benchmark_issue25_session39_4dev_seed167",
            "plan_benchmark_issue25_session39_4dev_seed193_dlrm",
            # a fresh 8-device task, then seed 201 again with six packings (its later run replaces the first)
            "plan_benchmark_issue25_session39_8dev_seed209", "plan_benchmark_issue25_session39_4dev_seed201_six"]
#: the runs of ``RUNS_ANY`` timed in transparent huge pages (formats revision 21, session 28 on: a device's
#: share of its run moves 3.2% between runs against 7.9% in small pages), tallied apart as well
RUNS_HUGE_PAGES = RUNS_ANY[RUNS_ANY.index("plan_benchmark_issue25_session28_8dev_seed167_any_thp"):]
TASK = ["family", "devices", "tables", "memory_bytes"]
#: a task whose A/A control (measured-greedy's plan timed twice in the run) is more than this far
#: from 1 was measured in a broken run (session 25: 0.697, a big-table device 40% slow for a whole
#: run); such a task is run again, whatever our plans measured in it, and counted as last measured
AA_BROKEN = 0.10
ROWS = {"refine": "neuroshard-refined", "plain": "neuroshard", "calibrated": "neuroshard-calibrated"}
#: the plain search with TorchRec's layouts, timed in the same run as the ``--row-blocks any`` plans
#: (``plan_benchmark.TORCHREC_LAYOUTS``): what the option buys, task by task
PAIRED = "neuroshard-torchrec-layouts"
#: the A/A control's plan (measured-greedy's, timed a second time in the run: ``plan_benchmark.CONTROL``)
CONTROL = "control"


def geomean(x: pd.Series) -> float:
    return float(np.exp(np.log(x.astype(float)).mean()))


def tally(runs: list[str]) -> pd.DataFrame:
    frames = []
    for order, run in enumerate(runs):
        path = RESULTS / run / "tasks.csv"
        if path.exists():
            frames.append(pd.read_csv(path).assign(run=run, order=order))
    rows = pd.concat(frames, ignore_index=True)
    latest = rows.groupby(TASK)["order"].transform("max")
    rows = rows[rows["order"] == latest]
    out = []
    for devices, part in rows.groupby("devices"):
        line = {"devices": devices, "tasks": len(part.drop_duplicates(TASK))}
        for label, algorithm in ROWS.items():
            g = part[part["algorithm"] == algorithm]
            line[f"{label}_geomean"] = geomean(g["ratio_to_best_baseline"])
            line[f"{label}_worst"] = float(g["ratio_to_best_baseline"].max())
        line["refine_total_work"] = geomean(part[part["algorithm"] == ROWS["refine"]]["total_ratio_to_least_baseline"])
        # the same plan's total work measured twice in its run (the A/A control's plan over measured-greedy's):
        # how far one task's total-work ratio is noise
        totals = part.set_index(TASK + ["algorithm"])["total_compute_ms"]
        control = totals.xs(CONTROL, level="algorithm")
        greedy = totals.xs("measured-greedy", level="algorithm").loc[control.index]
        line["aa_total_mean_abs_%"] = float(100 * np.abs(np.log(control / greedy)).mean())
        paired = part[part["algorithm"] == PAIRED]  # --row-blocks any runs from session 27 on
        if len(paired):
            line["paired_tasks"] = len(paired)
            line["torchrec_layouts_geomean"] = geomean(paired["ratio_to_best_baseline"])
            mine = part[part["algorithm"] == ROWS["plain"]].set_index(TASK)["ratio_to_best_baseline"]
            theirs = paired.set_index(TASK)["ratio_to_best_baseline"]
            line["plain_over_torchrec_layouts"] = geomean(mine.loc[theirs.index] / theirs)
        aa = part[part["algorithm"] == "A/A"]["aa_ratio"]
        line["aa_geomean"] = geomean(aa)
        line["aa_outside_10pct"] = int(((aa < 1 / (1 + AA_BROKEN)) | (aa > 1 + AA_BROKEN)).sum())
        line["runs"] = ", ".join(sorted(set(part["run"].str.replace("plan_benchmark_issue25_", ""))))
        out.append(line)
    return pd.DataFrame(out)


def main() -> None:
    pd.set_option("display.width", 250)
    print("# python experiments/issue25_tally.py")
    print(tally(RUNS).round(3).to_string(index=False))
    print("\n# our searches with --row-blocks any (row splits TorchRec does not run)")
    print(tally(RUNS_ANY).round(3).to_string(index=False))
    print("\n# the same, only the runs timed in huge pages (session 28 on)")
    print(tally(RUNS_HUGE_PAGES).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
