"""The judge of refine's last word: whole plans measured on this machine another way.

``refine`` times its plans with ``neuroshard measure``'s protocol: every device's tables in
the fused kernel, device by device, caches flushed before each pass. That instrument sees
one device at a time (its rounds, finalists and polish need per-device figures), and it
can rank two plans differently from training: the demo's refine kept size-lookup's plan,
measured cheapest by the kernel, and the training runtime measured it 2.8% slower than
lookup's (A/A 0.2%, 2026-11-27, Intel Xeon; docs/results.md, session 19). Training keeps a
device's hot rows warm from one step to the next, runs the backward pass and the all-to-all
too.

A ``PlanJudge`` measures whole plans and makes refine's final choice among the plans it
timed (every round's, the pre-trained search's, the polished one) and the baselines'
(``refine.COMPARE``): the plan it measures cheapest is written. The role is defined here;
the judges live above the measured loop (``runtime.judge.RuntimeJudge`` trains the plans on
the included runtime), and ``neuroshard.shard(..., refine=N, judge=J)`` or ``search
--refine N --judge runtime`` passes one down.
"""
from __future__ import annotations

import abc
import math

from ..plan import Plan
from ..tables import TableSet


class PlanJudge(abc.ABC):
    """Measures plans of the same tables together; lower is better. Hyper-parameters (runs,
    iterations, ...) go to ``__init__``; ``name`` says in provenance which judge decided."""

    name: str = ""

    @abc.abstractmethod
    def costs_ms(self, plans: list[Plan], tables: TableSet) -> list[list[float]]:
        """Per plan (in order), its measured cost (ms) in each of the judge's runs, the plans
        interleaved inside every run so that a slow spell of the machine hits all alike.
        Raises ``NeuroShardError`` (one line) when the plans cannot be measured here."""

    def describe(self) -> dict:
        """What provenance records about the judge (its name and hyper-parameters)."""
        return {"name": self.name, **{k: v for k, v in vars(self).items() if not k.endswith("_")}}


def geometric_mean(values: list[float]) -> float:
    """The statistic a judge's runs are combined with: the runs are paired (every plan in every
    run), so the plan of the least geometric mean has the least mean log-ratio to any other."""
    return math.exp(sum(math.log(v) for v in values) / len(values))
