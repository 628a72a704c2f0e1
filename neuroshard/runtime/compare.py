"""``neuroshard compare``: our plan against another planner's, timed on this machine.

Both plans are searched for the same tables, devices and memory (ours with the neuroshard
search, theirs with ``--against``: TorchRec's ``EmbeddingShardingPlanner`` by default), then
timed in one interleaved run of ``measure``'s instrument (``measure_plans``: every device of
every plan as one fused kernel, the devices taking turns round-robin), ours twice as an A/A
control: the two figures of the same plan say how far apart identical plans measure here,
and a ratio inside that band is a tie. The exchange is modeled, not measured (as ``measure``).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..plan import Plan
from ..tables import TableSet

if TYPE_CHECKING:  # the instrument imports torch: only when a comparison runs (``--help`` stays fast)
    from .measure_plan import MeasureResult

OURS, AGAIN = "neuroshard", "neuroshard (again)"


@dataclass
class Comparison:
    """Our plan and theirs, and the run that timed them (ours twice)."""

    against: str
    ours: Plan
    theirs: Plan
    result: "MeasureResult"
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
    from ..costmodels import resolve_cost_models
    from ..search.api import search_plan
    from .measure_plan import measure_plans
    models = resolve_cost_models(cost_models)
    plans, search_s = {}, {}
    for algorithm in (OURS, against):
        start = time.perf_counter()
        plans[algorithm] = search_plan(tables, devices, memory, algorithm, cost_models=models, seed=seed)
        search_s[algorithm] = round(time.perf_counter() - start, 3)
    result = measure_plans({OURS: plans[OURS], against: plans[against], AGAIN: plans[OURS]}, tables,
                           cost_models=models, **measure_options)
    return Comparison(against, plans[OURS], plans[against], result, search_s)


def _compare(args: argparse.Namespace) -> int:
    from ..io import atomic_write_text
    from ..validate import check_output
    output = check_output(args.output, [args.tables], "comparison file") if args.output else None
    tables = TableSet.read(args.tables)
    result = compare(tables, args.devices, args.memory, args.against, cost_models=args.cost_model, seed=args.seed,
                     passes=args.passes, progress=True)
    print(result.format())
    if output is not None:
        atomic_write_text(output, json.dumps(result.to_dict(), indent=1) + "\n")
        print(f"wrote {output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``compare`` to the subcommands."""
    from ..cli_options import add_input, add_output
    from ..constants import TIMING_PASSES
    from ..search.registry import ALGORITHMS
    from ..validate import device_count, memory_size, positive_int, seed_int
    p = sub.add_parser("compare", help="our plan against TorchRec's (or a baseline's), timed on this machine",
                       description="Search our plan and another planner's for the same tables, devices and memory, "
                                   "time both in one interleaved run of `measure` (ours twice, an A/A control) and "
                                   "print their measured ratio. The exchange is modeled, not measured.")
    add_input(p, "tables", "tables file (JSON, neuroshard.tables/v1)")
    p.add_argument("-d", "--devices", type=device_count, required=True, help="number of devices")
    p.add_argument("-m", "--memory", type=memory_size, required=True, help="memory per device, e.g. 16GiB")
    p.add_argument("--against", default="torchrec", choices=[a for a in ALGORITHMS if a != OURS],
                   help="the other planner (default: torchrec, TorchRec's EmbeddingShardingPlanner)")
    p.add_argument("--passes", type=positive_int, default=TIMING_PASSES,
                   help=f"timed passes over all devices, as `measure --passes` (default: {TIMING_PASSES})")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="cost-model checkpoint both searches and the estimates use (default: the shipped one)")
    p.add_argument("--seed", type=seed_int, default=0)
    add_output(p, "also write the comparison and the measurement as JSON", aliases=("--json",),
               metavar="OUT.json")
    p.set_defaults(func=_compare)
