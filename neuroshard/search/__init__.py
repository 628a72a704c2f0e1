"""Search sharding plans against cost models: the simulator, the NeuroShard search
(beam over splits, greedy grid over placement, row splits), the classic greedy
baselines, Bayesian optimisation and TorchRec's planner.

``shard(tables, devices=, memory=)`` is the one call most users need.
"""
from ..types import Estimate, Piece, Placement
from .api import ALGORITHMS, search_placement, shard
from .score import score_plan
from .simulator import Simulator

__all__ = ["shard", "score_plan", "search_placement", "ALGORITHMS", "Simulator", "Estimate", "Piece", "Placement"]
