"""What the measured loop says while it runs: one line, updated in place on a terminal.

The loop's stages take seconds to minutes each; ``Progress`` says which stage runs, what is
being timed, how many of how many, the best plan so far against the best baseline (their
measured ratio) and the time left of the budget:

    refine: compare: timing 6 plans together | best 0.962x size-lookup | 212 s left

On a terminal (``mode="auto"`` and standard error a TTY, or ``"bar"``) it is one tqdm line
redrawn in place, its time left ticking every second; otherwise (``"lines"``, or ``"auto"``
into a file or a pipe) plain lines, one when the stage or the work changes and at most one
every ``LINE_EVERY_S`` seconds for counts; ``"quiet"`` (``-q``) says nothing.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

#: the modes ``Progress`` takes
PROGRESS_MODES = ("auto", "bar", "lines", "quiet")
#: plain lines: at most one every this many seconds while only a count moves
LINE_EVERY_S = 10.0


class Progress:
    """The loop's progress line (module docstring). ``update`` sets what it says (the stage, what is
    being timed, ``done`` of ``total``), ``best`` the best plan so far against the best baseline,
    ``deadline`` (a ``time.monotonic`` time, None: no budget) the end the time left counts to."""

    def __init__(self, mode: str = "auto", stream: IO[str] | None = None, prefix: str = "refine") -> None:
        if mode not in PROGRESS_MODES:
            raise ValueError(f"progress mode must be one of {', '.join(PROGRESS_MODES)}, got {mode!r}")
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = "bar" if _is_terminal(self.stream) else "lines"
        self.mode, self.prefix = mode, prefix
        self.stage = self.what = ""
        self.done: int | None = None
        self.total: int | None = None
        self.ratio: str = ""
        self.deadline: float | None = None
        self._bar: Any = None
        self._said = ("", 0.0)  # the last plain line's (stage and work, time)
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def quiet(self) -> bool:
        return self.mode == "quiet"

    def line(self) -> str:
        """What the progress says now, in one line."""
        parts = [f"{self.prefix}: {self.stage}" + (f": {self.what}" if self.what else "")
                 + (f" {self.done}/{self.total}" if self.total else "")]
        if self.ratio:
            parts.append(self.ratio)
        if self.deadline is not None:
            parts.append(f"{max(0.0, self.deadline - time.monotonic()):.0f} s left")
        return " | ".join(parts)

    def update(self, stage: str | None = None, what: str | None = None, done: int | None = None,
               total: int | None = None) -> None:
        """Say ``stage`` (kept when None), ``what`` is being done (cleared with a new stage) and ``done`` of ``total``."""
        if self.quiet:
            return
        with self._lock:
            if stage is not None and stage != self.stage:
                self.stage, self.what = stage, ""
            if what is not None:
                self.what = what
            self.done, self.total = done, total
        self._show(force=done is None or done == total)

    def best(self, ratio: float | None, baseline: str | None) -> None:
        """The best plan so far measured ``ratio`` x the best ``baseline``'s (None: not timed against one yet)."""
        self.ratio = "" if ratio is None or not baseline else f"best {ratio:.3f}x {baseline}"
        self._show(force=True)

    def note(self, text: str) -> None:
        """A line of its own (a skipped stage, a stop), above the progress line on a terminal."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(f"{self.prefix}: {text}", file=self.stream)
        else:
            print(f"{self.prefix}: {text}", file=self.stream, flush=True)

    def close(self) -> None:
        """End the line (a terminal's is cleared); later updates open it again."""
        self._closed.set()
        if self._bar is not None:
            with self._lock:
                self._bar.close()
                self._bar = None
        self._ticker = None

    def _show(self, force: bool) -> None:
        if self.quiet:
            return
        if self.mode == "bar":
            self._redraw()
            return
        key, now = f"{self.stage}: {self.what}", time.monotonic()
        if force or key != self._said[0] or now - self._said[1] >= LINE_EVERY_S:
            self._said = (key, now)
            print(self.line(), file=self.stream, flush=True)

    def _redraw(self, reopen: bool = True) -> None:
        with self._lock:
            if self._bar is None and not reopen:
                return
            if self._bar is None:
                from tqdm import tqdm
                self._bar = tqdm(total=0, bar_format="{desc}", file=self.stream, leave=False, dynamic_ncols=True)
                self._closed.clear()
                if self._ticker is None and self.deadline is not None:
                    self._ticker = threading.Thread(target=self._tick, daemon=True, name="neuroshard-progress")
                    self._ticker.start()
            self._bar.set_description_str(self.line(), refresh=True)

    def _tick(self) -> None:
        """Redraw every second while the line is open (the time left moves on its own)."""
        while not self._closed.wait(1.0):
            try:
                self._redraw(reopen=False)
            except Exception:  # the stream closed under us: the line stops ticking, the work goes on
                return


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


__all__ = ["Progress", "PROGRESS_MODES", "LINE_EVERY_S"]
