"""Start one process per device, watch them, and end the run cleanly.

``launch`` spawns ``world_size`` workers on a free local port. The parent watches
them: a worker that raises or dies, or one that stops making progress for
``timeout_s`` seconds, ends the whole run with a one-line ``RunFailedError`` and
the other workers are killed, so a run never hangs. Under ``torchrun`` (``RANK``
and ``WORLD_SIZE`` in the environment) the caller runs the worker in-process
instead (``torchrun_env``).
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import NeuroShardError

log = logging.getLogger(__name__)

#: seconds the parent keeps listening after a first failure, to find its root cause
_GRACE_S = 2.0
_POLL_S = 0.1
#: seconds a fresh process may take to import its libraries before its first heartbeat
_STARTUP_S = 60.0
#: prctl option: signal to send this process when its parent dies (linux/prctl.h)
_PR_SET_PDEATHSIG = 1

# Progress milestones before the first step; from step 0 on, ``step_progress``.
NOT_STARTED, STARTED, JOINED, BUILT = -4, -3, -2, -1
#: where a rank is within one step, in order: its heartbeat says the step and the phase
STEP_PHASES = ("preparing inputs", "in the forward exchange", "in the backward pass", "finishing the step")
INPUTS, FORWARD_EXCHANGE, BACKWARD, FINISHING = range(len(STEP_PHASES))


def step_progress(step: int, phase: int = INPUTS) -> int:
    """The heartbeat's progress number at ``phase`` (an index of ``STEP_PHASES``) of ``step``;
    it grows through a run (``step_progress(steps)``: all steps done)."""
    return len(STEP_PHASES) * step + phase


class RunFailedError(NeuroShardError):
    """A training process crashed or hung; the run was stopped."""


@dataclass
class WorkerContext:
    """What a worker gets besides its own arguments: rank, world size, and a
    heartbeat to call with a growing progress number (a no-op under torchrun)."""

    rank: int
    world_size: int
    heartbeat_slots: Any = None

    def heartbeat(self, progress: int) -> None:
        if self.heartbeat_slots is not None:
            self.heartbeat_slots[self.rank] = progress


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when started by torchrun (or any env:// launcher), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def local_rank() -> int:
    """This process's index on its machine under torchrun (``LOCAL_RANK``), else 0."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def free_port() -> int:
    """A TCP port free on this machine right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_comm_error(exc: BaseException) -> bool:
    """An error raised by a collective (usually a consequence of another rank's failure)."""
    import torch.distributed as dist
    text = str(exc)
    return isinstance(exc, getattr(dist, "DistError", ())) or any(
        k in text for k in ("Connection closed by peer", "Connection reset", "gloo", "NCCL", "Timed out", "timeout"))


def die_with_parent(parent_pid: int | None = None) -> None:
    """Make this process end when its parent does (a launcher killed with ``kill -9`` must
    not leave workers running, or blocked writing a result to a dead pipe): on Linux the
    kernel sends SIGKILL on the parent's death (``prctl(PR_SET_PDEATHSIG)``); elsewhere a
    daemon thread polls the parent. Exits at once if the parent is already gone."""
    parent_pid = os.getppid() if parent_pid is None else parent_pid
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(1.0)
            os._exit(1)
        threading.Thread(target=watch, name="neuroshard-parent-watch", daemon=True).start()


def _entry(fn: Callable, args: tuple, rank: int, world_size: int, port: int, results: Any,
           heartbeat_slots: Any, log_level: int, parent_pid: int | None = None) -> None:
    """The spawned process: set up logging and the env:// rendezvous, run ``fn``, report back."""
    die_with_parent(parent_pid)
    logging.basicConfig(level=log_level, format=f"%(levelname)s rank {rank} %(name)s: %(message)s")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size)})
    try:
        wctx = WorkerContext(rank, world_size, heartbeat_slots)
        wctx.heartbeat(STARTED)
        out = fn(wctx, *args)
        results.put(("result", rank, out))
    except BaseException as exc:  # report anything, then exit non-zero
        kind = "comm" if _is_comm_error(exc) else "error"
        line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        log.debug("rank %d failed:\n%s", rank, traceback.format_exc())
        results.put(("failed", rank, (kind, line)))
        results.close()
        results.join_thread()
        os._exit(1)


def launch(fn: Callable, args: tuple, world_size: int, timeout_s: float, steps: int | None = None) -> dict[int, Any]:
    """Run ``fn(WorkerContext, *args)`` in ``world_size`` fresh processes; return each
    rank's return value. Raise RunFailedError when one fails or stalls for ``timeout_s``.
    With ``steps``, a progress bar on a terminal (tqdm; off when standard error is not
    one) follows the slowest rank from start-up (starting, joining, building: the silent
    half-minute) through its steps."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    slots = ctx.Array("q", [NOT_STARTED] * world_size, lock=False)
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, args, r, world_size, port, results, slots,
                                              logging.getLogger().getEffectiveLevel(), os.getpid()),
                         name=f"neuroshard-rank{r}", daemon=True) for r in range(world_size)]
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM must not orphan the workers
        previous = signal.signal(signal.SIGTERM, _raise_exit)
    outputs: dict[int, Any] = {}
    failures: dict[int, tuple[str, str]] = {}
    last_progress = list(slots)
    last_change = [time.monotonic()] * world_size
    first_failure: float | None = None
    bar = _progress_bar(world_size, steps)
    try:
        for p in procs:
            p.start()
        while True:
            try:
                kind, rank, payload = results.get(timeout=_POLL_S)
                if kind == "result":
                    outputs[rank] = payload
                else:
                    failures[rank] = payload
                    first_failure = first_failure or time.monotonic()
                continue
            except queue.Empty:
                pass
            now = time.monotonic()
            for r in range(world_size):
                if slots[r] != last_progress[r]:
                    last_progress[r], last_change[r] = slots[r], now
            if bar is not None:
                slowest = min(last_progress)
                bar.set_description_str(f"{world_size} ranks {_where(slowest)}", refresh=False)
                bar.n = max(0, slowest // len(STEP_PHASES))
                bar.refresh()
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in failures]
            if dead and first_failure is None:
                first_failure = now
            if len(outputs) == world_size and all(p.exitcode is not None for p in procs):
                return outputs
            if all(p.exitcode is not None for p in procs) and not dead and not failures:
                if len(outputs) == world_size:
                    return outputs
                first_failure = first_failure or now  # exited 0 without a result
            if first_failure is not None and now - first_failure >= _GRACE_S:
                raise RunFailedError(_diagnose(procs, failures, last_progress))
            stalled = [r for r in range(world_size) if procs[r].exitcode is None and now - last_change[r] > (
                max(timeout_s, _STARTUP_S) if last_progress[r] == NOT_STARTED else timeout_s)]
            if stalled and first_failure is None:
                slowest = min(last_progress[r] for r in stalled)
                culprits = [r for r in stalled if last_progress[r] == slowest]
                raise RunFailedError(f"rank {culprits[0]} made no progress for {timeout_s:g} s "
                                     f"({_where(slowest)}); the run was stopped")
    finally:
        if bar is not None:
            bar.close()
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=5)
        results.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _progress_bar(world_size: int, steps: int | None) -> Any:
    """A tqdm bar over ``steps`` steps, or None (no steps, or standard error not a terminal)."""
    if not steps:
        return None
    from tqdm import tqdm
    bar = tqdm(total=steps, unit="step", leave=False, disable=None, desc=f"{world_size} ranks starting")
    return None if bar.disable else bar


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _where(progress: int) -> str:
    """A progress number (a milestone, or ``step_progress``) in words."""
    if progress < 0:
        return {NOT_STARTED: "while starting", STARTED: "while joining the process group",
                JOINED: "while building the model"}.get(progress, "before the first step")
    step, phase = divmod(progress, len(STEP_PHASES))
    return f"at step {step}, {STEP_PHASES[phase]}"


def _diagnose(procs: list, failures: dict[int, tuple[str, str]], progress: list[int]) -> str:
    """The one line that explains a failed run: a rank's own error first, then a rank
    that died without a word, then a rank still stuck while others gave up on it."""
    for r in sorted(failures):
        kind, line = failures[r]
        if kind == "error":
            return f"rank {r} failed {_where(progress[r])}: {line}"
    for r, p in enumerate(procs):
        if p.exitcode not in (None, 0) and r not in failures:
            how = f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exited with code {p.exitcode}"
            return f"rank {r} {how} {_where(progress[r])}; the run was stopped"
    stuck = [r for r, p in enumerate(procs) if p.exitcode is None and r not in failures]
    if stuck and failures:
        r = min(stuck, key=lambda q: progress[q])
        return f"rank {r} stopped responding {_where(progress[r])}; the other ranks gave up waiting for it"
    if failures:
        r = min(failures)
        return f"rank {r} failed {_where(progress[r])}: {failures[r][1]}"
    return "a worker exited without a result; the run was stopped"
