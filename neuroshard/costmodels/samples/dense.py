"""Operator benchmark: the dense part of a training step and its overheads, timed on this
machine for the iteration-time model (``collect dense``).

What is timed, each on the modules the runtime trains (``neuroshard.dense``) with one
thread, as the runtime's processes run:

* ``linear``: one ``nn.Linear`` (+ ReLU) forward, and its backward (input, weight and bias
  gradients), by ``(batch, in, out, relu)``;
* ``interaction_dot`` / ``interaction_cat``: the interaction forward and backward, by
  ``(batch, features, width)`` / ``(batch, width out)`` (the dot's projections are linears);
* ``loss``: the loss forward and backward by batch;
* ``optimizer``: zeroing the gradients and the SGD step of an MLP's parameters, by
  ``(parameters, tensors)``;
* ``input``: a rank's data loading (each held table's lookups sampled for the global
  batch, made local to each shard, laid out for the fused kernel: what the runtime's
  ``make_batch`` and ``ShardedEmbeddings.prepare`` run) on tables of several families,
  by ``(tables, lookups drawn from reuse histograms, lookups drawn otherwise, shards,
  lookups kept)``;
* ``allreduce``, ``barrier``: gloo collectives between real processes (spawned here), by
  ``(bytes, ranks)`` and ``(ranks,)``.

Every shape's time is the median of ``rounds`` timed rounds, the shapes taken round-robin
within a round, so a slow spell of a shared machine spreads over all shapes instead of
biasing some; each timing repeats the operator until it lasts ``min_ms``, so that microsecond
operators are not clock noise. Samples are plain dicts (``{"kind", "features", "ms"}`` plus
``"fwd_ms"``/``"bwd_ms"`` for layers); ``costmodels.dense`` fits them.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...constants import MEASURED_BATCH_SIZE
from ...datasets.augment import benchmark_tables
from ...datasets.families import generate
from ...datasets.sampler import draw_lookups
from ...execution.dense import Interaction, mlp
from ...execution.kernels import FusedEmbedding, local_lookups
from ...execution.launch import WorkerContext, launch, step_progress
from ..base import few_threads
from ..dense import OperatorModels
from .kernel import KernelBenchmark
from .store import hardware_info

#: table families a rank's data loading is timed on (their samplers differ: reuse histograms, zipf)
INPUT_FAMILIES = ("dlrm-2021", "criteo-kaggle", "broad", "hot-few")
#: process counts the collectives are timed at
COLLECTIVE_RANKS = (2, 3, 4)
#: largest batch x in x out of a timed linear layer (about 4 GFLOP forward and backward)
MAX_LAYER_WORK = 2**31


def _repeat_time(fn: Callable[[], object], min_ms: float) -> float:
    """ms of one call of ``fn``: repeated until the calls last ``min_ms`` in all."""
    fn()
    start = time.perf_counter()
    fn()
    one = time.perf_counter() - start
    reps = max(1, int(min_ms / 1e3 / max(one, 1e-7)))
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def _round_robin(jobs: Sequence[Callable[[], dict]], rounds: int) -> list[list[dict]]:
    """Run every job once per round, rounds after rounds: each job's list of results."""
    out: list[list[dict]] = [[] for _ in jobs]
    for _ in range(rounds):
        for i, job in enumerate(jobs):
            out[i].append(job())
    return out


def _layer_job(module, inputs: Callable[[], tuple], min_ms: float) -> Callable[[], dict]:
    """A job timing ``module(*inputs)`` forward and its backward (from a sum of the output)."""
    import torch
    args = inputs()

    def forward():
        with torch.no_grad():
            module(*args)

    def both():
        module(*args).sum().backward()

    def job() -> dict:
        fwd = _repeat_time(forward, min_ms)
        total = _repeat_time(both, min_ms)
        return {"fwd_ms": fwd, "bwd_ms": max(total - fwd, 0.0)}
    return job


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> int:
    return int(round(2 ** rng.uniform(np.log2(low), np.log2(high))))


def _width(rng: np.random.Generator, low: float, high: float) -> int:
    """A layer width as models have them: any below 32, a multiple of 8 above (odd widths
    take other GEMM kernels, a few times slower, which no model width uses)."""
    w = _log_uniform(rng, low, high)
    return w if w < 32 else 8 * round(w / 8)


def layer_samples(count: int = 120, rounds: int = 5, min_ms: float = 2.0, seed: int = 0) -> list[dict]:
    """Linear layers, interactions and the loss at random shapes (local batches of 32-4,096)."""
    import torch
    rng = np.random.default_rng(seed)
    shapes, jobs = [], []
    with few_threads(1):
        for _ in range(count):
            b, i, o = _log_uniform(rng, 32, 4096), _width(rng, 4, 2048), _width(rng, 1, 2048)
            while b * i * o > MAX_LAYER_WORK:  # a few seconds per timing otherwise: beyond, cost scales with work
                b, i, o = _log_uniform(rng, 32, 4096), _width(rng, 4, 2048), _width(rng, 1, 2048)
            relu = int(rng.random() < 0.75)
            layer = mlp([i, o], last_relu=bool(relu))
            shapes.append(("linear", (b, i, o, relu)))
            jobs.append(_layer_job(layer, lambda b=b, i=i: (torch.randn(b, i, requires_grad=True),), min_ms))
        for _ in range(count // 3):
            b, d = _log_uniform(rng, 32, 4096), int(rng.choice([4, 8, 16, 32, 64, 128, 256]))
            tables = int(rng.integers(1, 120))
            dims = [d] * tables
            module = Interaction(dims, d, "dot")
            shapes.append(("interaction_dot", (b, tables + 1, d)))
            jobs.append(_layer_job(module, lambda b=b, d=d, t=tables: (torch.randn(b, d, requires_grad=True),
                                                                        torch.randn(b, d * t, requires_grad=True)),
                                   min_ms))
            widths = [int(w) for w in rng.choice([4, 8, 16, 32, 64, 128], size=int(rng.integers(1, 120)))]
            module = Interaction(widths, d, "cat")
            shapes.append(("interaction_cat", (b, d + sum(widths))))
            jobs.append(_layer_job(module, lambda b=b, d=d, w=sum(widths): (torch.randn(b, d, requires_grad=True),
                                                                             torch.randn(b, w, requires_grad=True)),
                                   min_ms))
        for _ in range(count // 6):
            b = _log_uniform(rng, 32, 4096)
            labels = (torch.rand(b) > 0.5).float()
            loss = _Loss(labels)
            shapes.append(("loss", (b,)))
            jobs.append(_layer_job(loss, lambda b=b: (torch.randn(b, requires_grad=True),), min_ms))
        results = _round_robin(jobs, rounds)
    out = []
    for (kind, features), runs in zip(shapes, results):
        fwd = statistics.median(r["fwd_ms"] for r in runs)
        bwd = statistics.median(r["bwd_ms"] for r in runs)
        out.append({"kind": kind, "features": list(features), "fwd_ms": fwd, "bwd_ms": bwd, "ms": fwd + bwd})
    return out


class _Loss:
    """The runtime's loss (``runtime.model.loss_sum``: BCE with logits, summed, scaled)."""

    def __init__(self, labels) -> None:
        self.labels = labels

    def __call__(self, logits):
        import torch.nn.functional as F
        return F.binary_cross_entropy_with_logits(logits, self.labels, reduction="sum") / len(self.labels)


def optimizer_samples(count: int = 40, rounds: int = 5, min_ms: float = 2.0, seed: int = 1) -> list[dict]:
    """Zeroing the gradients and one SGD step over random MLPs' parameters."""
    import torch
    rng = np.random.default_rng(seed)
    shapes, jobs = [], []
    with few_threads(1):
        for _ in range(count):
            widths = [_width(rng, 4, 2048) for _ in range(int(rng.integers(2, 9)))]
            model = mlp(widths, last_relu=False)
            params = list(model.parameters())
            for p in params:
                p.grad = torch.randn_like(p)
            opt = torch.optim.SGD(params, lr=0.01)

            def step(opt=opt, params=params):
                opt.step()
                for p in params:  # zero_grad sets None; keep gradients for the next repeat
                    p.grad.zero_()
            shapes.append((sum(p.numel() for p in params), len(params)))
            jobs.append(lambda step=step: {"ms": _repeat_time(step, min_ms)})
        results = _round_robin(jobs, rounds)
    return [{"kind": "optimizer", "features": [float(n), float(k)], "ms": statistics.median(r["ms"] for r in runs)}
            for (n, k), runs in zip(shapes, results)]


def input_samples(count: int = 40, rounds: int = 3, seed: int = 2,
                  batch_sizes: Sequence[int] = (256, 512, 1024, 2048, 4096)) -> list[dict]:
    """A rank's data loading for random sets of tables and shards (see the module docstring)."""
    import torch
    rng = np.random.default_rng(seed)
    pool = [t for family in INPUT_FAMILIES for t in generate(family, num_tables=40, seed=seed)]
    shapes, jobs = [], []
    with few_threads(1):
        for sample in range(count):
            tables = [pool[i] for i in rng.choice(len(pool), size=int(rng.integers(1, 40)), replace=False)]
            batch = int(rng.choice(batch_sizes))
            shards = []  # (table, row offset, rows): some tables split in row blocks
            for t in tables:  # a rank holds some row blocks of a split table (one at least)
                blocks = min(int(rng.choice([1, 1, 1, 2, 4])), t.num_embeddings)
                size = t.num_embeddings // blocks
                held = [k for k in range(blocks) if rng.random() < 0.5] or [int(rng.integers(blocks))]
                shards += [(t, k * size, size if k < blocks - 1 else t.num_embeddings - k * size) for k in held]
            rows_cap = 100_000
            # laying out inputs does not depend on the widths: narrow weights keep 60 samples' kernels small
            fused = FusedEmbedding([(min(r, rows_cap), 4) for t, _, r in shards], "auto", "cpu")
            hist = sum(float(t.pooling_factor) * batch for t in tables if "reuse_histogram" in t.access)
            other = sum(float(t.pooling_factor) * batch for t in tables) - hist
            kept = sum(float(t.pooling_factor) * batch * r / t.num_embeddings for t, _, r in shards)

            def load(tables=tables, shards=shards, batch=batch, fused=fused, sample=sample):
                lookups = {t.name: draw_lookups(t, batch, seed=sample) for t in tables}
                torch.randn(batch, 13)
                per_shard = [local_lookups(*lookups[t.name], off, r, t.num_embeddings, min(r, rows_cap))
                             for t, off, r in shards]
                fused.prepare(per_shard)
            shapes.append((len(tables), hist, other, len(shards), kept))
            jobs.append(lambda load=load: {"ms": _repeat_time(load, 1.0)})
        results = _round_robin(jobs, rounds)
    return [{"kind": "input", "features": [float(x) for x in f], "ms": statistics.median(r["ms"] for r in runs)}
            for f, runs in zip(shapes, results)]


def _collective_repeats(size: int) -> int:
    """Calls of a collective per timing: the same on every rank (a count that each rank chose
    from its own clock would leave one rank waiting in a collective the others never start)."""
    return int(np.clip(2**22 // max(size, 2**12), 3, 100))


def _collective_time(fn: Callable[[], object], repeats: int) -> float:
    """ms of one call of the collective ``fn`` (the mean of ``repeats`` calls, after one)."""
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def _collective_worker(wctx: WorkerContext, sizes: Sequence[int], rounds: int) -> list[dict] | None:
    import datetime

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=wctx.rank, world_size=wctx.world_size,
                            timeout=datetime.timedelta(seconds=120))
    try:
        tensors = [torch.ones(max(1, s // 4)) for s in sizes]
        times: dict[int, list[float]] = {s: [] for s in sizes}
        barrier: list[float] = []
        for r in range(rounds):
            wctx.heartbeat(step_progress(r))  # the launcher stops ranks silent for its timeout
            for s, x in zip(sizes, tensors):
                dist.barrier()
                times[s].append(_collective_time(lambda x=x: dist.all_reduce(x), _collective_repeats(s)))
            dist.barrier()
            barrier.append(_collective_time(dist.barrier, _collective_repeats(0)))
        # every rank's medians go to rank 0, which keeps the slowest rank's (a collective ends together)
        mine = [statistics.median(times[s]) for s in sizes] + [statistics.median(barrier)]
        gathered = [None] * wctx.world_size if wctx.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if wctx.rank != 0:
            return None
        worst = np.max(np.array(gathered, dtype=np.float64), axis=0)
        out = [{"kind": "allreduce", "features": [float(s), float(wctx.world_size)], "ms": float(ms)}
               for s, ms in zip(sizes, worst[:-1])]
        return out + [{"kind": "barrier", "features": [float(wctx.world_size)], "ms": float(worst[-1])}]
    finally:
        dist.destroy_process_group()


def collective_samples(ranks: Sequence[int] = COLLECTIVE_RANKS, rounds: int = 5,
                       sizes: Sequence[int] | None = None, timeout_s: float = 300.0) -> list[dict]:
    """gloo all-reduces of 1 KiB to 32 MiB (a dense model's gradients) and barriers, between ``ranks``
    real processes."""
    sizes = list(sizes) if sizes is not None else [int(2 ** e) for e in np.arange(10, 25.5, 1.0)]
    out: list[dict] = []
    for world in ranks:
        out += launch(_collective_worker, (sizes, rounds), world, timeout_s)[0]
    return out


def embedding_split_samples(count: int = 30, seed: int = 3, batch_size: int = MEASURED_BATCH_SIZE) -> list[dict]:
    """The forward share of a fused embedding kernel's forward + backward (warm caches, as a
    training step runs it), on random shard sets: the iteration model splits the compute
    model's figure with it."""
    rng = np.random.default_rng(seed)
    train, test = benchmark_tables("dlrm-2021")
    pool = list(train) + list(test)
    bench = KernelBenchmark(batch_size=batch_size, flush_bytes=0, memory_bytes=2**40)  # rows are capped
    out = []
    for _ in range(count):
        shards = [pool[i] for i in rng.choice(len(pool), size=int(rng.integers(1, 20)), replace=False)]
        m = bench.measure(shards)
        out.append({"kind": "embedding_split", "features": [float(len(shards))], "ms": m.cost_ms,
                    "fwd_ms": m.fwd_ms, "bwd_ms": m.cost_ms - m.fwd_ms})
    return out


#: the benchmark's parts, in the order ``collect dense`` runs them
PARTS: dict[str, Callable[..., list[dict]]] = {
    "layers": layer_samples,
    "optimizer": optimizer_samples,
    "input": input_samples,
    "collectives": collective_samples,
    "embedding_split": embedding_split_samples,
}

#: sample counts per part: ``full`` for a machine's models (a few minutes), ``quick`` for a smoke test
SIZES: dict[str, dict[str, dict]] = {
    "full": {"layers": {"count": 240}, "optimizer": {"count": 40}, "input": {"count": 60},
             "collectives": {}, "embedding_split": {"count": 30}},
    "quick": {"layers": {"count": 24, "rounds": 2, "min_ms": 0.5}, "optimizer": {"count": 12, "rounds": 2},
              "input": {"count": 12, "rounds": 1}, "collectives": {"ranks": (2,), "rounds": 2},
              "embedding_split": {"count": 3}},
}


def collect_dense(path, size: str | dict = "full", progress: Callable[[str], None] | None = None):
    """Measure every part (``PARTS``; ``size``: a name of ``SIZES`` or such a dict of each part's
    arguments) and write the fitted operator models to ``path`` after each part, so an
    interrupted run keeps what it finished; a rerun measures only the parts the file lacks.
    Returns the models."""
    path = Path(path)
    existing = OperatorModels.read(path) if path.exists() else None
    samples = existing.samples_ if existing is not None else []
    points = existing.overhead_points_ if existing is not None else []  # kept: `collect overheads` measured them
    done = {s.get("part") for s in samples}
    hardware = hardware_info("cpu")
    sizes = SIZES[size] if isinstance(size, str) else size
    for part, measure in PARTS.items():
        if part in done:
            continue
        if progress is not None:
            progress(part)
        samples += [{**s, "part": part} for s in measure(**sizes[part])]
        OperatorModels().fit(samples, hardware, points).save(path)
    return OperatorModels.read(path)
