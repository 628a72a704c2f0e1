"""Injected faults: the one test seam in production code paths.

Tests and drills make a training rank or a communication-benchmark device fail on
purpose, to check that the launcher and the benchmark notice and say which one.
Nothing else in the package injects failures; everything that does goes through here:

* a training run: ``RunConfig.fault`` or the ``NEUROSHARD_FAULT`` environment variable
  (``"raise|exit|hang:RANK:STEP"``), read once by ``trainer.run`` before any worker starts;
* the communication benchmark: ``CommBenchmark.measure(_exit_early=RANK)`` (that device exits).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from .errors import NeuroShardError

log = logging.getLogger(__name__)

#: environment variable that injects a fault into a training run, "raise|exit|hang:RANK:STEP"
FAULT_ENV = "NEUROSHARD_FAULT"
FAULT_KINDS = ("raise", "exit", "hang")
#: exit code of a process that an injected fault ends
FAULT_EXIT_CODE = 3


@dataclass(frozen=True)
class Fault:
    """Fail ``rank`` at ``step`` by ``kind``: raise an error, exit the process, or hang."""

    kind: str
    rank: int
    step: int

    @classmethod
    def parse(cls, text: str) -> "Fault":
        try:
            kind, rank, step = text.split(":")
            fault = cls(kind, int(rank), int(step))
        except ValueError:
            raise NeuroShardError(f"fault {text!r} is not KIND:RANK:STEP") from None
        if fault.kind not in FAULT_KINDS:
            raise NeuroShardError(f"unknown fault kind {fault.kind!r} (choose from {', '.join(FAULT_KINDS)})")
        return fault

    def inject(self, rank: int, step: int) -> None:
        """Fail now when this is the fault's rank and step."""
        if rank != self.rank or step != self.step:
            return
        log.warning("rank %d: injecting fault '%s' at step %d", rank, self.kind, step)
        if self.kind == "raise":
            raise RuntimeError(f"injected fault at step {step}")
        if self.kind == "exit":
            os._exit(FAULT_EXIT_CODE)
        time.sleep(10**6)  # hang


def training_fault(configured: str | None) -> str | None:
    """The fault a training run injects: the configured one, else ``$NEUROSHARD_FAULT`` (checked)."""
    text = configured or os.environ.get(FAULT_ENV) or None
    if text is not None:
        Fault.parse(text)
    return text


def exit_if_chosen(chosen: int | None, rank: int) -> None:
    """The communication benchmark's device ``rank`` exits when it is the one ``chosen`` to."""
    if chosen == rank:
        os._exit(FAULT_EXIT_CODE)
