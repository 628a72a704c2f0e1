"""Shard sets the search proposes: devices of plans searched on tasks drawn from a tables file.

Random augmented sets (``collect.sample_shard_set``) cover the feature space; the
search, though, asks the compute model about device sets of plans, whose mix of
tables, splits and sizes random sets rarely hit. ``collect compute --sets plans``
measures those instead: task ``j`` is a random subset of the tables file on 4, 8 or
16 devices (5 to 40 tables per device, memory 1.2-1.5x the tables), planned by one of
the NeuroShard search and the greedy baselines against the shipped cost models;
sample ``i`` is one device of task ``i // DEVICES_PER_TASK``'s plan.
"""
from __future__ import annotations

import functools
import logging
from typing import Sequence

import numpy as np

from ..constants import FP32_BYTES
from ..costmodels import DEFAULT_CHECKPOINT, load_cost_models
from ..datasets.sampler import shard_table
from ..errors import InfeasibleError, NeuroShardError
from ..search.api import search_plan
from ..search.registry import with_trait
from ..tables import Table, TableSet

log = logging.getLogger(__name__)

#: device counts, algorithms and tables per device of the planned tasks
TASK_DEVICES = (4, 8, 16)
TASK_ALGORITHMS = with_trait("plan_sets")
TABLES_PER_DEVICE = (5, 40)
#: samples measured from one plan (different devices)
DEVICES_PER_TASK = 4


class PlanSetSampler:
    """Device shard sets of searched plans (see the module docstring); ``alloc_bytes`` bounds
    the weights one set allocates (rows capped at ``max_rows``, as the benchmark does)."""

    def __init__(self, tables: Sequence[Table], batch_size: int, seed: int, alloc_bytes: int, max_rows: int):
        self.tables, self.batch_size, self.seed = list(tables), batch_size, seed
        self.alloc_bytes, self.max_rows = alloc_bytes, max_rows

    @functools.cached_property
    def cost_models(self):
        return load_cost_models(DEFAULT_CHECKPOINT)  # the shipped models: the same sets on every machine

    @functools.lru_cache(maxsize=4)
    def plan(self, task: int):
        rng = np.random.default_rng([self.seed, task])
        for _ in range(20):
            devices = int(rng.choice(TASK_DEVICES))
            count = min(len(self.tables), devices * int(rng.integers(TABLES_PER_DEVICE[0], TABLES_PER_DEVICE[1] + 1)))
            chosen = np.sort(rng.choice(len(self.tables), size=count, replace=False))
            tables = TableSet(f"plan-set-task{task}", [self.tables[int(i)] for i in chosen], self.batch_size)
            memory = int(tables.total_bytes(4) * rng.uniform(1.2, 1.5) / devices) + 1
            algorithm = str(rng.choice(TASK_ALGORITHMS))
            try:
                return search_plan(tables, devices=devices, memory=memory, algorithm=algorithm, seed=task,
                                   cost_models=self.cost_models), tables
            except InfeasibleError:
                continue
        raise NeuroShardError(f"no feasible task found for plan-set task {task}")

    def __call__(self, sample: int) -> list[Table]:
        plan, tables = self.plan(sample // DEVICES_PER_TASK)
        rng = np.random.default_rng([self.seed, sample])
        for device in rng.permutation(plan.num_devices):
            shards = [shard_table(tables[s.table], s.row_offset, s.num_rows, s.col_offset, s.num_cols,
                                  self.batch_size) for s in plan.shards_on(int(device))]
            alloc = sum(min(t.num_embeddings, self.max_rows) * t.embedding_dim * FP32_BYTES for t in shards)
            if shards and alloc <= self.alloc_bytes:
                for t, s in zip(shards, plan.shards_on(int(device))):
                    t.extra = {**t.extra, "source_table": s.table}
                return shards
        raise NeuroShardError(f"plan-set sample {sample}: no device of its plan fits {self.alloc_bytes} bytes")
