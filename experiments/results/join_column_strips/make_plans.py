"""The plans of experiments/results/join_column_strips: criteo-terabyte, 4 devices, seed 137,
tasks 0 and 1, NeuroShard's search as one host (as plan_benchmark --one-host searches them).

    python experiments/results/join_column_strips/make_plans.py new DIR   # this tree
    git worktree add /tmp/before 1743f90 && cd /tmp/before && \
        PYTHONPATH=. python /path/to/make_plans.py old DIR                  # before the join
"""
import sys
from pathlib import Path

from neuroshard.costmodels import resolve_cost_models
from neuroshard.datasets.families import family_tasks
from neuroshard.search.api import shard
from neuroshard.topology import Topology

tag, out = sys.argv[1], Path(sys.argv[2])
models = resolve_cost_models(None)
for i, (tables, memory) in enumerate(family_tasks("criteo-terabyte", 4, 2, (8, 12), seed=137)):
    if tag == "new":
        tables.write(out / f"tables{i}.json")
    plan = shard(tables, 4, memory, "neuroshard", cost_models=models, seed=i, topology=Topology(4, local_world_size=4))
    plan.write(out / f"{tag}{i}.json")
    print(tag, i, len(plan.shards), plan.estimate["max_device_cost_ms"])
