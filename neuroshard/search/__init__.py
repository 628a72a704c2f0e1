"""Search sharding plans against cost models, timing no hardware: the simulator, the
NeuroShard search (beam over splits, greedy grid over placement, row splits, local
search), the classic greedy baselines and Bayesian optimisation, behind one registry
(``registry``; measured-greedy and TorchRec's planner register there from
``neuroshard.measured`` and ``neuroshard.torchrec``).

``shard(tables, devices=, memory=)`` searches against the models alone;
``neuroshard.shard`` adds the measured loop (calibration, refine rounds).
"""
from ..types import Estimate, Piece, Placement
from .api import search_placement, shard
from .registry import ALGORITHMS
from .score import score_plan
from .simulator import Simulator

__all__ = ["shard", "score_plan", "search_placement", "ALGORITHMS", "Simulator", "Estimate", "Piece", "Placement"]
