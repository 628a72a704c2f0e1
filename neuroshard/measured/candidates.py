"""The plans compared with the rounds' plans, and the names every candidate goes by.

Besides each round's plan, refine times: the same search against the pre-trained models
(``<algorithm>-pretrained``: a model fine-tuned on a few hundred sets can be worse where the
search goes), the same search against the calibration's work model alone (``<algorithm>-work``,
``costmodels.ensemble``: a plan the members' errors did not steer), and the plans of the
baselines a user would otherwise run (``COMPARE``: measured-greedy, size-lookup, ...). Later the
rebalance stage adds plans made from the timed ones, named ``"<start>, <how>"`` (``HOW_KEPT``).
"""
from __future__ import annotations

import logging
from typing import Any

from ..costmodels.ensemble import work_cost_models
from ..errors import NeuroShardError
from ..plan import Plan
from ..search.api import search_plan
from ..search.registry import get_trait, with_trait
from ..tables import TableSet

log = logging.getLogger("neuroshard.measured.refine")  # the loop's stages log as refine

#: the baselines whose plans join the measured comparison: what a user would otherwise run
#: (docs/decisions.md#measured-greedy; the cheap greedy plans cost one device set each to time)
COMPARE = with_trait("refine_compares")
#: the name in ``compared`` of the search's plan against the pre-trained (not calibrated) models
PRETRAINED_SUFFIX = "-pretrained"
#: the name in ``compared`` of the search's plan against the calibration's work model alone
WORK_SUFFIX = "-work"
#: the ``shard`` options that describe the plan (not the algorithm): the compared baselines get them too
PLAN_OPTIONS = ("bytes_per_element", "seed", "optimizer", "topology", "comm_precision")

#: how a rebalanced plan kept is named (``"<start>, <how>"``, ``measured.rebalance``): moved whole tables
#: (``rebalanced``), whole tables placed afresh by the fitted costs (``repacked``; evenly: as many pieces on
#: every device), the slowest device's dearest table cut into row blocks (``split``), and cut so with the rest
#: placed afresh (``split and repacked``; docs/decisions.md#rebalance)
REBALANCED, REPACKED, REPACKED_EVEN, SPLIT, SPLIT_REPACKED = ("rebalanced", "repacked", "repacked evenly", "split",
                                                             "split and repacked")
#: every way a rebalanced plan kept is named (the suffix after its start's name and a comma)
HOW_KEPT = (REBALANCED, REPACKED, REPACKED_EVEN, SPLIT, SPLIT_REPACKED)


def other_plans(tables: TableSet, devices: int, memory: Any, calibration: Any, models: Any, algorithm: str,
                compare: tuple[str, ...], search_options: dict, budget: Any = None,
                pretrained: Plan | None = None) -> tuple[list[Plan], list[dict]]:
    """The plans compared with the rounds', and their records (``provenance.refine.compared``: a
    baseline that found no plan has ``failed`` and no plan): the same search against the pre-trained
    models (``pretrained`` when it was searched already) and against the calibration's work model
    alone, then the ``compare`` algorithms'. With a ``budget``, a baseline that times this machine
    (measured-greedy: its units alone) runs only when its estimate fits (stage ``measured-greedy``);
    else its record has ``skipped`` and no plan."""
    plans, compared = [], []
    # the same search against the pre-trained models: fine-tuned on a few hundred sets, a model
    # can be worse where the search goes (docs/decisions.md#refine-loop)
    plans.append(pretrained if pretrained is not None else
                 search_plan(tables, devices, memory, algorithm=algorithm, cost_models=calibration.models,
                             **search_options))
    compared.append({"algorithm": f"{algorithm}{PRETRAINED_SUFFIX}"})
    # the same search against the calibration's work model alone: a plan the members' errors did not
    # steer (costmodels.ensemble)
    work = work_cost_models(models)
    if work is not None:
        plans.append(search_plan(tables, devices, memory, algorithm=algorithm, cost_models=work, **search_options))
        compared.append({"algorithm": f"{algorithm}{WORK_SUFFIX}"})
    options = {k: v for k, v in search_options.items() if k in PLAN_OPTIONS}
    for name in (c for c in compare if c != algorithm):
        timed = get_trait(name, "needs_hardware")
        if timed and budget is not None:
            cost = budget.timing_s(len(tables), 1)  # its units alone, about one per table, one pass each
            if not budget.fits("measured-greedy", cost):
                why = budget.out_of_time("measured-greedy", "timing its units alone", cost)
                budget.skip(name, why)
                compared.append({"algorithm": name, "skipped": why})
                continue
            budget.say(f"{name}: timing its units alone")
        try:
            if timed and budget is not None:
                with budget.stage(name):
                    started = budget.clock()
                    plans.append(search_plan(tables, devices, memory, algorithm=name, cost_models=models, **options))
                    budget.timed(len(tables), 1, budget.clock() - started)  # what the next estimates learn from
            else:
                plans.append(search_plan(tables, devices, memory, algorithm=name, cost_models=models, **options))
            compared.append({"algorithm": name})
        except NeuroShardError as exc:  # e.g. no plan fits, or tables only data_parallel may hold
            log.warning("refine: %s found no plan to compare with: %s", name, exc)
            compared.append({"algorithm": name, "failed": str(exc).splitlines()[0]})
    return plans, compared


def timed_entries(compared: list[dict]) -> list[dict]:
    """The records of ``compared`` that have a plan (not ``failed``, not ``skipped``), in order."""
    return [c for c in compared if "failed" not in c and "skipped" not in c]


__all__ = ["COMPARE", "PRETRAINED_SUFFIX", "WORK_SUFFIX", "PLAN_OPTIONS", "HOW_KEPT", "other_plans", "timed_entries"]
