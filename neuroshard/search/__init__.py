"""Search sharding plans against cost models, timing no hardware: the simulator, the
NeuroShard search (beam over splits, greedy grid over placement, row splits, local
search), the classic greedy baselines and Bayesian optimisation, behind one registry
(``registry``; measured-greedy and TorchRec's planner register there from
``neuroshard.measured`` and ``neuroshard.torchrec``).

``search_plan(tables, devices=, memory=)`` searches against the models alone;
``neuroshard.shard`` adds the measured loop (calibration, refine rounds).

Importing this package imports none of its modules: each name below is loaded from its
module on first use (``neuroshard.on_first_use``), so the command line's parser and
``neuroshard.search.registry`` stay light.
"""
from ..on_first_use import on_first_use

_ON_FIRST_USE = {"search_plan": "api", "search_placement": "api", "ALGORITHMS": "registry", "score_plan": "score",
                 "Simulator": "simulator"}
__getattr__, __dir__ = on_first_use(__name__, _ON_FIRST_USE)

__all__ = sorted(_ON_FIRST_USE)
