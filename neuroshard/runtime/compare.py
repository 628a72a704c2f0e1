"""``neuroshard compare``: our plan against another planner's, timed on this machine.

Both plans are searched for the same tables, devices and memory (ours with the neuroshard
search, theirs with ``--against``: TorchRec's ``EmbeddingShardingPlanner`` by default), then
timed in one interleaved run of ``measure``'s instrument (``measure_plans``: every device of
every plan as one fused kernel, the devices taking turns round-robin), ours twice as an A/A
control: the two figures of the same plan say how far apart identical plans measure here,
and a ratio inside that band is a tie. The exchange is modeled, not measured (as ``measure``).
The command is ``compare_cli``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..costmodels import resolve_cost_models
from ..plan import Plan
from ..search.api import search_plan
from ..tables import TableSet
from .measure_plan import MeasureResult, measure_plans

OURS, AGAIN = "neuroshard", "neuroshard (again)"


@dataclass
class Comparison:
    """Our plan and theirs, and the run that timed them (ours twice)."""

    against: str
    ours: Plan
    theirs: Plan
    result: MeasureResult
    search_s: dict

    @property
    def ratio(self) -> float:
        """Their plan's measured max-device compute over ours: above 1 ours is faster here."""
        return self.result[self.against].max_compute_ms / self.result[OURS].max_compute_ms

    @property
    def control(self) -> float:
        """The A/A band: how far apart our plan's two figures of this run are (a fraction)."""
        first, again = self.result[OURS].max_compute_ms, self.result[AGAIN].max_compute_ms
        return abs(again - first) / min(first, again)

    def format(self) -> str:
        ours, theirs = self.result[OURS], self.result[self.against]
        c = self.result.config
        verdict = ("a tie: inside the A/A band" if abs(self.ratio - 1) <= self.control else
                   "ours is faster here" if self.ratio > 1 else "theirs is faster here")
        return "\n".join([
            f"{OURS}: {len(self.ours.shards)} shards; {self.against}: {len(self.theirs.shards)} shards; "
            f"{self.ours.num_devices} devices (searched in {self.search_s[OURS]:.1f} s and "
            f"{self.search_s[self.against]:.1f} s)",
            f"timed together on {c['backend']} ({c['hardware']}), kernel {c['kernel']}, batch {c['batch_size']:,} "
            f"per device, {c['passes']} passes, {c['seconds']:.1f} s",
            f"max device compute, measured: {OURS} {ours.max_compute_ms:.3f} ms, {self.against} "
            f"{theirs.max_compute_ms:.3f} ms: {self.against} / ours = {self.ratio:.3f} ({verdict})",
            f"A/A control: our plan measured twice in the run, {ours.max_compute_ms:.3f} and "
            f"{self.result[AGAIN].max_compute_ms:.3f} ms, {100 * self.control:.1f}% apart",
            f"with the exchange modeled (not measured): {OURS} {ours.max_total_ms:.3f} ms, {self.against} "
            f"{theirs.max_total_ms:.3f} ms"])

    def to_dict(self) -> dict:
        return {"against": self.against, "ratio": self.ratio, "aa_control": self.control, "search_s": self.search_s,
                "measurement": self.result.to_dict()}


def compare(tables: TableSet, devices: int, memory: Any, against: str = "torchrec", *, cost_models: Any = None,
            seed: int = 0, **measure_options: Any) -> Comparison:
    """Our plan and ``against``'s for the same task, timed together on this machine with an
    A/A control (``measure_options`` go to ``measure_plans``: passes, batch_size, ...)."""
    models = resolve_cost_models(cost_models)
    plans, search_s = {}, {}
    for algorithm in (OURS, against):
        start = time.perf_counter()
        plans[algorithm] = search_plan(tables, devices, memory, algorithm, cost_models=models, seed=seed)
        search_s[algorithm] = round(time.perf_counter() - start, 3)
    result = measure_plans({OURS: plans[OURS], against: plans[against], AGAIN: plans[OURS]}, tables,
                           cost_models=models, **measure_options)
    return Comparison(against, plans[OURS], plans[against], result, search_s)
