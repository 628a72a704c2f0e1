"""The measured loop's time budget: one deadline for calibration and every stage of refine.

A ``Budget`` is started where the loop starts (``neuroshard.shard(..., refine=N)``, ``search
--refine``, the demo before its calibration). Each stage runs inside ``budget.stage(name)``,
which records its seconds; before a stage, and inside the long loops (calibration's runs, each
refine round, each rebalance round, each polish step), the loop asks ``budget.fits(stage,
seconds)`` whether the work's estimated cost fits, and records ``budget.skip(stage, why)`` when
it does not. A run of the device timer cannot be cut short, so none is started whose estimate
does not fit: the loop ends within about one run's error of the deadline.

*Estimates.* Timing costs are estimated from the runs made so far: a run of ``sets`` device
sets in ``passes`` passes costs ``sets x (passes + 1)`` units (the sizing run and the kernel's
build count as one more pass), each unit the seconds per unit measured so far
(``timed``; ``RefineConfig.unit_prior_s`` before any run).

*Priorities.* ``RefineConfig.stage_priority`` orders the stages by the gain per second their
records showed (docs/decisions.md#refine-budget). Every stage still to come states its estimate
(``expect``); a stage then runs only when its own estimate leaves the estimates of the stages of
higher priority still to come (those that fit at all), so calibration, which runs first, does not
take the time the comparison and the rebalance need, and an extra refine round runs only when
everything of more worth fits too.

*Stops.* Ctrl-C raises ``KeyboardInterrupt``; with ``stop_on_sigterm`` SIGTERM raises
``Terminated`` (a ``KeyboardInterrupt``). Refine catches both and returns the best plan measured
so far (``keep``); ``provenance.refine.stopped`` says why (``stop_reason``) and the command exits
with ``EXIT_STOPPED``'s status after writing it.
"""
from __future__ import annotations

import math
import re
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import NeuroShardError
from .config import DEFAULT_CONFIG, RefineConfig, default_budget_s
from .progress import Progress

#: the exit status of a command stopped before its end that wrote the best plan so far: 128 + the
#: signal, as a shell reports a process the signal ended (Ctrl-C: SIGINT, 2; SIGTERM, 15)
EXIT_STOPPED = {"interrupted": 130, "terminated": 143}

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread while ``stop_on_sigterm`` is in force."""


def stop_reason(exc: BaseException) -> str:
    """How the loop was stopped, in ``provenance.refine.stopped``'s words."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While in force (main thread only), SIGTERM raises ``Terminated`` where the loop is, so
    that it stops as on Ctrl-C and the best plan so far is written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def parse_budget(text: Any) -> float:
    """A budget in seconds from ``300``, ``300s``, ``5m``, ``1.5h``, ``2m30s`` (or a number);
    ``none`` or ``inf``: no bound (``math.inf``). One-line ``NeuroShardError`` otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        spoken = str(text).strip().lower()
        if spoken in ("none", "inf", "unbounded"):
            return math.inf
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*(min|h|m|s|)", spoken)
        if not parts or re.sub(r"\s+", "", spoken) != "".join(n + u for n, u in parts):
            raise NeuroShardError(f"a budget is seconds or a duration such as 300, 90s, 5m, 1h, 2m30s (or none), "
                                  f"got {text!r}")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds > 0:
        raise NeuroShardError(f"a budget must be more than 0 seconds, got {text!r}")
    return seconds


class Budget:
    """The deadline of one measured loop (module docstring). ``seconds``: its length (None or
    ``math.inf``: unbounded; stage seconds are still recorded); ``progress``: what it says while it
    runs (``measured.progress.Progress``; none by default)."""

    def __init__(self, seconds: float | None = None, progress: Progress | None = None,
                 config: RefineConfig = DEFAULT_CONFIG, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = None if seconds is None or math.isinf(seconds) else float(seconds)
        self.config, self.clock = config, clock
        self.started = clock()
        self.progress = progress if progress is not None else Progress("quiet")
        self.progress.deadline = None if self.seconds is None else self.started + self.seconds
        self.stage_s: dict[str, float] = {}
        self.skipped: list[dict] = []
        self.stopped: str | None = None
        self.expected: dict[str, Callable[[], float]] = {}
        self.timed_s, self.units = 0.0, 0.0
        self.fine_tune_s_per_set: float | None = None  # measured by the first fine-tuning
        self.best_plan: Any = None
        self.best_name: str | None = None
        self.current: str | None = None
        self._inner: list[float] = []  # the seconds of the stages run inside each stage running

    @classmethod
    def for_task(cls, devices: int, seconds: Any = None, progress: str | Progress = "auto",
                 config: RefineConfig = DEFAULT_CONFIG) -> "Budget":
        """A budget started now: ``seconds`` parsed (``parse_budget``; None: ``default_budget_s(devices)``)."""
        length = default_budget_s(devices, config) if seconds is None else parse_budget(seconds)
        return cls(length, progress if isinstance(progress, Progress) else Progress(progress), config)

    @property
    def bounded(self) -> bool:
        return self.seconds is not None

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    # ------------------------------------------------------------------ estimates
    def timed(self, sets: int, passes: int, seconds: float) -> None:
        """A timing run of ``sets`` device sets in ``passes`` passes took ``seconds``."""
        self.timed_s += seconds
        self.units += sets * (passes + 1)

    def learn(self, seconds: float, units: float) -> None:
        """Start from a rate measured before the budget was given (a calibration timed already)."""
        if not self.units and units:
            self.timed_s, self.units = seconds, units

    def unit_s(self) -> float:
        """Seconds per unit (one set timed in one pass) as measured so far, or the prior."""
        return self.timed_s / self.units if self.units and self.timed_s > 0 else self.config.unit_prior_s

    def timing_s(self, sets: int, passes: int | None = None, runs: int = 1) -> float:
        """The estimated seconds of ``runs`` timing runs of ``sets`` sets in ``passes`` passes
        (None: ``compare_passes``)."""
        passes = self.config.compare_passes if passes is None else passes
        return runs * sets * (passes + 1) * self.unit_s()

    def fine_tune_s(self, sets: int) -> float:
        """The estimated seconds of fine-tuning the models on ``sets`` measured sets."""
        rate = self.fine_tune_s_per_set
        return sets * (self.config.fine_tune_prior_s if rate is None else rate)

    def expect(self, stage: str, estimate: Callable[[], float]) -> None:
        """``stage`` is still to come and will cost about ``estimate()`` seconds (asked anew each time)."""
        self.expected[stage] = estimate

    def reserved(self, stage: str) -> float:
        """The seconds held for the stages of higher priority than ``stage`` still to come (each
        counted when it fits, after those before it, in what remains)."""
        order = self.config.stage_priority
        rank = order.index(stage) if stage in order else len(order)
        left, held = self.remaining(), 0.0
        for other in order[:rank]:
            if other in self.expected and other != stage:
                cost = self.expected[other]()
                if held + cost <= left:
                    held += cost
        return held

    def room(self, stage: str) -> float:
        """The seconds ``stage`` may spend now: what remains less what is held for stages of more worth."""
        return math.inf if not self.bounded else self.remaining() - self.reserved(stage)

    def fits(self, stage: str, seconds: float) -> bool:
        """Whether work of ``stage`` estimated at ``seconds`` fits (always, unbounded)."""
        return not self.bounded or seconds <= self.room(stage)

    # ------------------------------------------------------------------ stages
    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Run stage ``name``: it is no longer expected (it holds no time against its own parts), and
        its seconds are recorded (added up when it runs again; a stage run inside it counts as its own)."""
        self.expected.pop(name, None)
        previous, self.current = self.current, name
        start = self.clock()
        self._inner.append(0.0)
        self.progress.update(stage=name)
        try:
            yield
        finally:
            took = self.clock() - start
            inner = self._inner.pop()
            self.stage_s[name] = self.stage_s.get(name, 0.0) + took - inner
            if self._inner:
                self._inner[-1] += took
            self.current = previous
            if previous is not None:
                self.progress.update(stage=previous)

    def skip(self, stage: str, why: str) -> None:
        """Record that (part of) ``stage`` was skipped, and why."""
        self.expected.pop(stage, None)
        self.skipped.append({"stage": stage, "why": why})
        self.progress.note(f"{stage} skipped: {why}")

    def out_of_time(self, stage: str, what: str, seconds: float) -> str:
        """Why ``what`` of ``stage`` (estimated at ``seconds``) does not fit, in words."""
        room = self.room(stage)
        held = self.reserved(stage)
        return (f"{what} needs about {seconds:.0f} s, {max(room, 0.0):.0f} s left for it"
                + (f" ({held:.0f} s held for stages of more worth)" if held > 0 else ""))

    def say(self, what: str, done: int | None = None, total: int | None = None) -> None:
        """What is being done now in the current stage (the progress line)."""
        self.progress.update(stage=self.current, what=what, done=done, total=total)

    def keep(self, plan: Any, name: str, ratio: float | None = None, baseline: str | None = None) -> None:
        """``plan`` (named ``name``) is the best measured so far: what is written if the loop stops now;
        ``ratio``: its measured cost over the best ``baseline``'s."""
        self.best_plan, self.best_name = plan, name
        if ratio is not None:
            self.progress.best(ratio, baseline)

    def stop(self, reason: str) -> None:
        """The loop stopped before its end (``stop_reason``)."""
        self.stopped = reason
        self.progress.note(f"{reason}: writing the best plan so far ({self.best_name or 'the search'}'s)")

    def record(self) -> dict:
        """``provenance.refine``'s budget fields (docs/formats.md)."""
        out = {"budget_s": None if self.seconds is None else round(self.seconds, 2),
               "wall_s": round(self.elapsed(), 2),
               "stage_s": {name: round(s, 2) for name, s in self.stage_s.items()},
               "skipped": list(self.skipped)}
        if self.stopped:
            out["stopped"] = self.stopped
        return out


def format_budget(record: dict) -> str:
    """One line from ``provenance.refine``'s budget fields: the budget, the whole wall time,
    each stage's seconds, what was skipped and why, and how the loop stopped."""
    budget = record.get("budget_s")
    stages = ", ".join(f"{name} {s:.0f} s" for name, s in record.get("stage_s", {}).items())
    skipped = "; ".join(f"{s['stage']} ({s['why']})" for s in record.get("skipped", []))
    stopped = record.get("stopped")
    return (f"refine: {record.get('wall_s', float('nan')):.0f} s in all"
            + (f" of a {budget:.0f} s budget" if budget is not None else " (no budget)")
            + (f": {stages}" if stages else "")
            + (f"; skipped: {skipped}" if skipped else "; nothing skipped")
            + (f"; {stopped} before the end: the best plan so far written" if stopped else ""))


__all__ = ["Budget", "Terminated", "EXIT_STOPPED", "parse_budget", "stop_on_sigterm", "stop_reason",
           "format_budget"]
