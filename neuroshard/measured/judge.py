"""The judge of refine's last word: whole plans measured on this machine another way.

``refine`` times its plans with ``neuroshard measure``'s protocol: every device's tables in
the fused kernel, device by device, caches flushed before each pass. That instrument sees
one device at a time (its rounds, finalists and polish need per-device figures), and it
can rank two plans differently from training: the demo's refine kept size-lookup's plan,
measured cheapest by the kernel, and the training runtime measured it 2.8% slower than
lookup's (A/A 0.2%, Intel Xeon; docs/decisions.md#runtime-judge). Training keeps a
device's hot rows warm from one step to the next, runs the backward pass and the all-to-all
too.

A ``PlanJudge`` measures whole plans and makes refine's final choice among the plans it
timed (every round's, the pre-trained search's, the polished one) and the baselines'
(``candidates.COMPARE``): the plan it measures cheapest is written (``final_judgement``).
The role is defined here; the judges live above the measured loop
(``runtime.judge.RuntimeJudge`` trains the plans on the included runtime), and
``neuroshard.shard(..., refine=N, judge=J)`` or ``search --refine N --judge runtime`` passes
one down.
"""
from __future__ import annotations

import abc
import logging
import math

from ..errors import NeuroShardError
from ..plan import Plan
from ..tables import TableSet

log = logging.getLogger("neuroshard.measured.refine")  # the loop's stages log as refine


class PlanJudge(abc.ABC):
    """Measures plans of the same tables together; lower is better. Hyper-parameters (runs,
    iterations, ...) go to ``__init__``; ``name`` says in provenance which judge decided."""

    name: str = ""

    @abc.abstractmethod
    def costs_ms(self, plans: list[Plan], tables: TableSet) -> list[list[float]]:
        """Per plan (in order), its measured cost (ms) in each of the judge's runs, each plan
        measured in turns beside the first (or all interleaved) so that a slow spell of the
        machine hits the plans it compares alike.
        Raises ``NeuroShardError`` (one line) when the plans cannot be measured here."""

    def describe(self) -> dict:
        """What provenance records about the judge (its name and hyper-parameters)."""
        return {"name": self.name, **{k: v for k, v in vars(self).items() if not k.endswith("_")}}


def geometric_mean(values: list[float]) -> float:
    """The statistic a judge's runs are combined with: the runs are paired (every plan in every
    run), so the plan of the least geometric mean has the least mean log-ratio to any other."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def final_judgement(named: list[tuple[str, Plan]], tables: TableSet, judge: PlanJudge) -> tuple[Plan, dict]:
    """The plan ``judge`` measures cheapest among the distinct plans of ``named`` ((name, plan),
    the plan refine chose first: it stays on a tie and when the judge cannot measure them here),
    and the record of the judgement: every plan's cost per run and the geometric mean that
    decided."""
    distinct: dict[tuple, tuple[str, Plan]] = {}
    for name, plan in named:
        distinct.setdefault(plan.layout_key(), (name, plan))
    candidates = list(distinct.values())
    record: dict = {"judge": judge.describe()}
    if len(candidates) < 2:
        record["skipped"] = "one distinct plan"
        return named[0][1], record
    try:
        costs = judge.costs_ms([plan for _, plan in candidates], tables)
    except NeuroShardError as exc:
        log.warning("refine: the %s judge could not measure the plans; keeping %s: %s", judge.name, named[0][0], exc)
        record["stopped"] = str(exc).splitlines()[0]
        return named[0][1], record
    means = [geometric_mean(c) for c in costs]
    best = min(range(len(candidates)), key=lambda k: (means[k], k))
    record["plans"] = [{"plan": name, "costs_ms": [round(c, 4) for c in run], "geomean_ms": round(m, 4)}
                       for (name, _), run, m in zip(candidates, costs, means)]
    record["chosen"] = candidates[best][0]
    log.info("refine: the %s judge measured %d distinct plans; kept %s (%.2f ms; %s first, %.2f ms)", judge.name,
             len(candidates), candidates[best][0], means[best], candidates[0][0], means[0])
    return candidates[best][1], record


def format_judgement(judged: dict) -> str:
    """One line from ``final_judgement``'s record: what the judge measured and which plan it kept
    (``search --refine N --judge`` and the demo print it)."""
    name = judged["judge"]["name"]
    if "plans" not in judged:
        return (f"refine, final judge {name}: {judged.get('skipped') or judged.get('stopped')}; "
                f"the kernel's choice written")
    return (f"refine, final judge {name} ({judged['judge'].get('runs')} runs, the slowest device's embedding cost, "
            f"geometric mean): " + "; ".join(f"{p['plan']} {p['geomean_ms']:.2f} ms" for p in judged["plans"])
            + f"; written: {judged['chosen']}'s plan")


__all__ = ["PlanJudge", "geometric_mean", "final_judgement", "format_judgement"]
