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
from ..search.api import shard
from ..search.registry import with_trait
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
                compare: tuple[str, ...], search_options: dict) -> tuple[list[Plan], list[dict]]:
    """The plans compared with the rounds', and their records (``provenance.refine.compared``: a
    baseline that found no plan has ``failed`` and no plan): the same search against the pre-trained
    models and against the calibration's work model alone, then the ``compare`` algorithms'."""
    plans, compared = [], []
    # the same search against the pre-trained models: fine-tuned on a few hundred sets, a model
    # can be worse where the search goes (docs/decisions.md#refine-loop)
    plans.append(shard(tables, devices, memory, algorithm=algorithm, cost_models=calibration.models,
                       **search_options))
    compared.append({"algorithm": f"{algorithm}{PRETRAINED_SUFFIX}"})
    # the same search against the calibration's work model alone: a plan the members' errors did not
    # steer (costmodels.ensemble)
    work = work_cost_models(models)
    if work is not None:
        plans.append(shard(tables, devices, memory, algorithm=algorithm, cost_models=work, **search_options))
        compared.append({"algorithm": f"{algorithm}{WORK_SUFFIX}"})
    options = {k: v for k, v in search_options.items() if k in PLAN_OPTIONS}
    for name in (c for c in compare if c != algorithm):
        try:
            plans.append(shard(tables, devices, memory, algorithm=name, cost_models=models, **options))
            compared.append({"algorithm": name})
        except NeuroShardError as exc:  # e.g. no plan fits, or tables only data_parallel may hold
            log.warning("refine: %s found no plan to compare with: %s", name, exc)
            compared.append({"algorithm": name, "failed": str(exc).splitlines()[0]})
    return plans, compared


__all__ = ["COMPARE", "PRETRAINED_SUFFIX", "WORK_SUFFIX", "PLAN_OPTIONS", "HOW_KEPT", "other_plans"]
