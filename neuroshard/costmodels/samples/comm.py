"""Communication benchmark: the all-to-alls of sharded embeddings between D real processes.

``CommBenchmark(D)`` starts D worker processes (``torch.multiprocessing`` spawn)
that form one ``torch.distributed`` group (gloo over loopback on CPU, NCCL on
GPU, a free TCP port picked by the benchmark) and stay up for many
measurements. For one sample, device ``d`` holds shards of total width
``widths[d]`` and ``skews_ms[d]`` of compute to do first (it busy-waits that long
before the collective, so early devices wait for late ones as in training).
Each repeat times, per device:

* forward: the training runtime's own exchange (``neuroshard.execution.exchange.PooledExchange``):
  an ``all_to_all_single`` of pooled embeddings, the batch split across devices
  (device ``d`` gets ``b_d`` ≈ B/D samples; every source sends
  ``[b_dst, widths[src]]`` to every destination), and the layout of the received
  columns into the ``[b_d, sum(widths)]`` features; the time runs from the end of
  the device's own skew, so it includes waiting;
* backward: the reverse exchange of the gradients (columns picked, then
  ``[b_src, widths[dst]]`` sent back to each holder), after a barrier;
* reduce: the reduction row-wise shards need: every device holds partial sums
  ``[B, reduce_width]`` and ends with the summed ``[b_d, reduce_width]`` of its
  samples. gloo has no ``reduce_scatter``, so it is an ``all_to_all_single`` plus
  a local sum over the D received parts (on NCCL too, for one code path).

Medians over ``repeats`` timed repeats (after ``warmup``). A worker that dies or
hangs ends the call with ``NeuroShardError`` within ``timeout_s``: the group's
own timeout breaks collectives a dead peer would block, and the parent kills
every worker when the deadline passes.
"""
from __future__ import annotations

import datetime
import logging
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...constants import MEASURED_BATCH_SIZE, batch_shares
from ...errors import NeuroShardError
from ...execution.exchange import PooledExchange
from ...execution.launch import die_with_parent
from ...faults import exit_if_chosen
from ...validate import check_comm_precision

log = logging.getLogger(__name__)

#: what forward and backward times cover (recorded with the data: older data timed the bare all-to-all)
TIMED = "runtime exchange: all-to-all and column layout"


@dataclass
class CommMeasurement:
    """Per-device medians (ms) of one width/skew sample."""

    fwd_ms: list[float]
    bwd_ms: list[float]
    reduce_ms: list[float]
    cv_fwd: float          # median over devices of the coefficient of variation of forward times
    cv_bwd: float


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _busy_wait_ms(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def _cv(values: Sequence[float]) -> float:
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or values.mean() <= 0:
        return 0.0
    return float(values.std(ddof=1) / values.mean())


def _run_sample(rank: int, world: int, task: dict, device) -> dict:
    """One sample on one rank: warm-up + repeats of forward, backward, reduce."""
    import torch
    import torch.distributed as dist
    widths, skews, reduce_width = task["widths"], task["skews_ms"], int(task["reduce_width"])
    b = batch_shares(int(task["batch_size"]), world)
    batch = sum(b)
    w_me = int(widths[rank])
    sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)
    exchange = PooledExchange.for_widths([int(w) for w in widths], rank, world, batch, device,
                                         task.get("comm_precision", "fp32"))
    pooled = torch.ones(batch, w_me, device=device)                 # this device's shards, whole batch
    grad = torch.ones(b[rank], exchange.output_width, device=device)  # gradient of its samples' features
    red_in = torch.ones(batch * reduce_width, device=device)
    red_out = torch.empty(world * b[rank] * reduce_width, device=device)
    red_in_splits = [b[d] * reduce_width for d in range(world)]
    red_out_splits = [b[rank] * reduce_width] * world
    fwd, bwd, red = [], [], []
    for rep in range(int(task["warmup"]) + int(task["repeats"])):
        dist.barrier()
        _busy_wait_ms(float(skews[rank]))
        t0 = time.perf_counter()
        exchange.forward(pooled)
        sync()
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        exchange.backward(grad)
        sync()
        t3 = time.perf_counter()
        if reduce_width > 0:
            dist.barrier()
            t4 = time.perf_counter()
            dist.all_to_all_single(red_out, red_in, red_out_splits, red_in_splits)
            red_out.view(world, b[rank], reduce_width).sum(dim=0)
            sync()
            r = (time.perf_counter() - t4) * 1e3
        else:
            r = 0.0
        if rep >= int(task["warmup"]):
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t3 - t2) * 1e3)
            red.append(r)
    return {"fwd": fwd, "bwd": bwd, "reduce": red}


def _worker(rank: int, world: int, backend: str, init_method: str, timeout_s: float, conn) -> None:
    """A device: joins the group, then runs the tasks the parent sends until told to stop."""
    die_with_parent()  # a collection killed with kill -9 leaves no worker behind
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", rank % torch.cuda.device_count())
        else:
            device = torch.device("cpu")
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        conn.send({"ready": rank})
        while True:
            task = conn.recv()
            if task is None:
                break
            exit_if_chosen(task.get("exit_early"), rank)  # the test seam (``faults``): a device dies mid-run
            conn.send(_run_sample(rank, world, task, device))
        dist.destroy_process_group()
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as exc:  # report, then die: the parent turns it into a NeuroShardError
        try:
            conn.send({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
        except Exception:
            pass


class CommBenchmark:
    """D real processes on ``torch.distributed`` measuring all-to-all costs.

    Use as a context manager (``with CommBenchmark(3) as bench: bench.measure(...)``);
    the workers start on entry and stop on exit."""

    def __init__(self, num_devices: int, backend: str = "cpu", batch_size: int = MEASURED_BATCH_SIZE,
                 warmup: int = 2, repeats: int = 7, timeout_s: float = 60.0) -> None:
        if not isinstance(num_devices, int) or num_devices < 2:
            raise NeuroShardError(f"communication needs at least 2 devices, got {num_devices!r}")
        if backend not in ("cpu", "cuda"):
            raise NeuroShardError(f"unknown backend {backend!r}; choose one of cpu, cuda")
        if backend == "cuda":
            import torch
            if not torch.cuda.is_available():
                raise NeuroShardError("backend cuda asked for, but torch sees no CUDA device")
        if not isinstance(batch_size, int) or batch_size < num_devices:
            raise NeuroShardError(f"batch_size must be an integer >= the number of devices, got {batch_size!r}")
        if repeats < 1 or warmup < 0:
            raise NeuroShardError("repeats must be >= 1 and warmup >= 0")
        self.num_devices = num_devices
        self.backend = backend
        self.dist_backend = "nccl" if backend == "cuda" else "gloo"
        self.batch_size = batch_size
        self.warmup = warmup
        self.repeats = repeats
        self.timeout_s = float(timeout_s)
        self._procs: list = []
        self._conns: list = []

    def config(self) -> dict:
        return {"backend": self.backend, "dist_backend": self.dist_backend, "num_devices": self.num_devices,
                "batch_size": self.batch_size, "warmup": self.warmup, "repeats": self.repeats,
                "timed": TIMED}

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "CommBenchmark":
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{free_port()}"
        for rank in range(self.num_devices):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, self.num_devices, self.dist_backend, init_method,
                                                     self.timeout_s, child), daemon=True)
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        self._gather(self.timeout_s + 60.0, "start")  # + time to import torch in each worker
        log.info("comm benchmark: %d %s workers up (pids %s)", self.num_devices, self.dist_backend, self.pids)
        return self

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except Exception:
                pass
        deadline = time.monotonic() + 10.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(5.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> "CommBenchmark":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ API
    def measure(self, widths: Sequence[int], skews_ms: Sequence[float] | None = None,
                reduce_width: int = 0, timeout_s: float | None = None,
                _exit_early: int | None = None, comm_precision: str = "fp32") -> CommMeasurement:
        """Per-device forward, backward and reduce times (ms, medians) of one sample, the
        exchange sending ``comm_precision``; a device that dies or stays silent past
        ``timeout_s`` (default: the benchmark's) raises."""
        check_comm_precision(comm_precision)
        if not self._procs:
            raise NeuroShardError("the communication benchmark is not running (use it as a context manager)")
        d = self.num_devices
        widths = [int(w) for w in widths]
        skews = [0.0] * d if skews_ms is None else [float(s) for s in skews_ms]
        if len(widths) != d or len(skews) != d:
            raise NeuroShardError(f"need {d} widths and {d} skews, got {len(widths)} and {len(skews)}")
        if min(widths) < 0 or min(skews) < 0 or reduce_width < 0:
            raise NeuroShardError("widths, skews and reduce_width must be >= 0")
        task = {"widths": widths, "skews_ms": skews, "reduce_width": int(reduce_width),
                "batch_size": self.batch_size, "warmup": self.warmup, "repeats": self.repeats,
                "comm_precision": comm_precision}
        if _exit_early is not None:
            task["exit_early"] = _exit_early
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(task)
            except (BrokenPipeError, OSError):
                self._fail(f"device {rank} (pid {self._procs[rank].pid}) is gone")
        budget = (self.timeout_s if timeout_s is None else timeout_s) \
            + (self.warmup + self.repeats) * (max(skews) / 1e3 + 0.5)
        results = self._gather(budget, "measure")
        med = lambda xs: float(statistics.median(xs))  # noqa: E731
        return CommMeasurement(fwd_ms=[med(r["fwd"]) for r in results], bwd_ms=[med(r["bwd"]) for r in results],
                               reduce_ms=[med(r["reduce"]) for r in results],
                               cv_fwd=float(np.median([_cv(r["fwd"]) for r in results])),
                               cv_bwd=float(np.median([_cv(r["bwd"]) for r in results])))

    def _gather(self, timeout_s: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        results: list = [None] * self.num_devices
        pending = set(range(self.num_devices))
        while pending:
            from multiprocessing.connection import wait
            ready = wait([self._conns[r] for r in pending], timeout=0.5)
            for rank in sorted(pending):
                conn, proc = self._conns[rank], self._procs[rank]
                if conn in ready:
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        proc.join(1.0)
                        self._fail(f"device {rank} (pid {proc.pid}) died during {what}"
                                   + (f" with exit code {proc.exitcode}" if proc.exitcode is not None else ""))
                    if "error" in msg:
                        self._fail(self._dead_devices(what) or f"device {rank} failed during {what}: {msg['error']}")
                    results[rank] = msg
                    pending.discard(rank)
                elif not proc.is_alive():
                    proc.join(1.0)
                    self._fail(f"device {rank} (pid {proc.pid}) exited during {what} with exit code {proc.exitcode}")
            if pending and time.monotonic() > deadline:
                self._fail(f"devices {sorted(pending)} did not answer within {timeout_s:.0f} s during {what}")
        return results

    def _dead_devices(self, what: str) -> str:
        """The root cause when a device reports a broken collective: a peer that died."""
        time.sleep(0.5)
        dead = [(r, p) for r, p in enumerate(self._procs) if not p.is_alive()]
        dead = [(r, p) for r, p in dead if p.exitcode != 0] or dead  # workers that saw the break exit with 0
        return "; ".join(f"device {r} (pid {p.pid}) exited during {what} with exit code {p.exitcode}"
                         for r, p in dead)

    def _fail(self, message: str):
        self._kill()
        raise NeuroShardError(f"communication benchmark stopped: {message}")
