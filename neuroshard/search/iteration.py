"""The iteration-time model: what one training step of a plan takes, end to end, on the
critical path (Lin et al., "Building a Performance Model for Deep Learning
Recommendation Model Training on GPUs").

Each rank runs the included runtime's step (``runtime.trainer``) as a chain of operators,
and the collectives join the chains (a collective ends for everyone once the last rank
has reached it, plus its own duration)::

    emb_fwd -> [fwd all-to-all] -> dense_fwd -> dense_bwd -> [dense all-reduce] -> optimizer
            -> [bwd all-to-all] -> emb_bwd -> [replicated all-reduce] -> input -> [barrier]

``input`` is the next step's data loading, which the runtime does before the barrier that
starts a step, so one period runs from one barrier to the next and each rank's terms add
up to it. Every term is per rank and in ms at the run's batch:

* ``emb_fwd_ms`` / ``emb_bwd_ms``: the compute model's figure for the rank's shards (one
  fused kernel, ``Simulator``), split by the measured forward share of the kernel
  (operator kind ``embedding_split``);
* ``fwd_comm_ms`` / ``bwd_comm_ms``: the comm model's exchange (``Simulator.exchange_ms``)
  plus the waiting for the last rank to arrive (the critical path's own result);
* ``dense_fwd_ms`` / ``dense_bwd_ms``: the operators of ``neuroshard.model_spec.dense_operators``
  on the rank's local batch, each priced by the operator models (``costmodels.dense``);
* ``dense_allreduce_ms``: a gloo all-reduce of the dense gradients' bytes over the ranks, one
  per DDP bucket (25 MiB), waiting included;
* ``optimizer_ms``, ``input_ms`` (sampling the held tables' lookups for the global batch,
  making them local to each shard, laying them out), ``sync_ms`` (the barrier, waiting
  included);
* ``allreduce_ms``: the replicated tables' gradient all-reduce (``Simulator``), when any;
* ``other_ms``: the host-side work between operators that no operator model covers (0
  from the operators; the overheads below give it its measured size).

These are the operators' own figures (``operator_durations``). Real runs add overheads
(dispatch and DDP's hooks around the dense operators, collective latency, data loading's
host work, ranks sharing cores): ``OperatorModels.with_overheads`` adds, per term, what
``collect overheads`` measured (``runtime.overheads``). The predicted iteration is then the
critical path's period, stretched as measured (``OperatorModels.with_period``: ranks sharing
the machine's cores, memory and gloo's threads), the stretch spread over ``STRETCH_TERMS`` in
proportion (with one rank, ``sync_ms`` takes it). The
critical path walks back from the end through each collective to the rank that arrived last. GPU-only terms (kernel launches, CUDA
streams) are not in this model: the included runtime measured here runs on CPU, and a
figure for a GPU says so ("not measured here") until a GPU measures it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..constants import ITERATION_TERMS, batch_shares
from ..costmodels.base import CostModels
from ..costmodels.dense import OperatorModels
from ..model_spec import DEFAULT_MODEL, ModelSpec, dense_operators, dense_parameters
from ..plan import Plan
from ..tables import TableSet
from .simulator import Simulator

#: DDP's default bucket: gradients are all-reduced in calls of at most this many bytes
DDP_BUCKET_BYTES = 25 * 2**20
#: the terms that take the period's stretch, each rank's in proportion to their size: the dense part
#: and the collectives, which the measured steps show slowed in real runs (the embeddings' and data
#: loading's own overheads already carry theirs). Until 2026-12-05 the stretch went to the dense
#: all-reduce alone (it was waiting, in runs whose steps alternated between plans; formats revision
#: 32). On the runs in turns (experiments/results/iteration_turns; chosen on the turns and
#: two-process suites, checked on embedding-heavy and turns-two), per-term GMAE charged to the
#: all-reduce / spread here: forward all-to-all 20.4/7.8%, dense forward 17.4/7.3%, backward
#: 10.5/10.9%, all-reduce 175/60%, optimizer 24.2/8.0%, backward all-to-all 23.2/10.3%; spread over
#: every term instead, data loading went 3.1 -> 16.5% and the embeddings 6-8 -> 12%. The
#: iteration's own figure is the same either way.
STRETCH_TERMS = ("fwd_comm_ms", "dense_fwd_ms", "dense_bwd_ms", "dense_allreduce_ms", "optimizer_ms", "bwd_comm_ms")
#: the chain of one rank's step: (term, the collective that ends it, or None)
STEP_CHAIN: tuple[tuple[str, str | None], ...] = (
    ("emb_fwd_ms", None), ("fwd_comm_ms", "exchange"), ("dense_fwd_ms", None), ("dense_bwd_ms", None),
    ("dense_allreduce_ms", "allreduce"), ("optimizer_ms", None), ("bwd_comm_ms", "exchange"),
    ("emb_bwd_ms", None), ("allreduce_ms", "allreduce"), ("input_ms", None), ("sync_ms", "barrier"),
    ("other_ms", None),
)


@dataclass
class IterationEstimate:
    """Predicted per-rank terms (ms, ``ITERATION_TERMS``), the iteration (the period), and the
    critical path: ``(rank, term, ms)`` segments from the start of the step to its end."""

    iteration_ms: float
    per_rank: list[dict[str, float]]
    critical_path: list[tuple[int, str, float]]
    batch_size: int
    model: ModelSpec
    sources: dict = field(default_factory=dict)

    @property
    def terms(self) -> list[str]:
        present = {t for row in self.per_rank for t in row}
        return [t for t in ITERATION_TERMS if t in present]

    def to_dict(self) -> dict:
        return {"iteration_ms": round(self.iteration_ms, 6), "batch_size": self.batch_size,
                "ranks": len(self.per_rank), "model": self.model.to_dict(),
                "breakdown": {"terms": self.terms,
                              "per_rank": [{t: round(row[t], 6) for t in self.terms if t in row}
                                           for row in self.per_rank]},
                "critical_path": [{"rank": r, "term": t, "ms": round(ms, 6)} for r, t, ms in self.critical_path],
                "sources": self.sources}

    def format(self) -> str:
        """A table: one row per rank, a column per term, then the critical path."""
        import pandas as pd
        df = pd.DataFrame([{t.removesuffix("_ms"): row.get(t, 0.0) for t in self.terms} for row in self.per_rank])
        df.insert(0, "rank", range(len(self.per_rank)))
        on_path = " -> ".join(f"{t.removesuffix('_ms')}@{r}" for r, t, ms in self.critical_path if ms > 0)
        return (f"predicted iteration: {self.iteration_ms:.3f} ms per step at batch {self.batch_size:,} on "
                f"{len(self.per_rank)} ranks ({self.model.describe()})\n"
                + df.round(3).to_string(index=False)
                + f"\ncritical path: {on_path}")


def input_features(plan: Plan, tables: TableSet, rank: int, batch_size: int) -> list[float]:
    """The ``input`` operator's shape for ``rank``: (tables sampled, lookups drawn for the
    global batch from reuse histograms, lookups drawn otherwise, shards, lookups kept by the
    shards)."""
    by_name = {t.name: t for t in tables}
    held = {s.table for s in plan.shards_on(rank)} | set(plan.data_parallel_tables)
    hist = sum(float(by_name[n].pooling_factor) * batch_size for n in held if "reuse_histogram" in by_name[n].access)
    other = sum(float(by_name[n].pooling_factor) * batch_size for n in held) - hist
    shards = plan.shards_on(rank)
    kept = sum(float(by_name[s.table].pooling_factor) * batch_size * s.num_rows / by_name[s.table].num_embeddings
               for s in shards)
    return [float(len(held)), hist, other, float(len(shards)), kept]


def operator_durations(plan: Plan, tables: TableSet, cost_models: CostModels, operators: OperatorModels,
                       model: ModelSpec = DEFAULT_MODEL, batch: int | None = None) -> tuple[list[dict[str, float]], Simulator]:
    """Per rank, each term's own duration from the operator and embedding models alone (no
    waiting, no overheads; module docstring), and the simulator that priced the embeddings."""
    batch = int(batch or tables.batch_size)
    sim = Simulator.from_plan(plan, cost_models, tables, batch_size=batch)
    ranks = plan.num_devices
    compute = sim.evaluate_plan(plan).compute_ms[0]
    fwd_x, bwd_x = sim.exchange_ms(plan)
    share = operators.one("embedding_split", [1.0], "fwd_share")
    dims = [t.embedding_dim for t in tables]
    params, _ = dense_parameters(model, dims)
    buckets = max(1, int(np.ceil(4.0 * params / DDP_BUCKET_BYTES)))
    allreduce = buckets * operators.one("allreduce", [4.0 * params / buckets, float(ranks)]) if ranks > 1 else 0.0
    barrier = operators.one("barrier", [float(ranks)]) if ranks > 1 else 0.0
    replicated = float(sim.replicated_ms()[1]) if plan.data_parallel_tables else None
    durations = []
    for rank, local in enumerate(batch_shares(batch, ranks)):
        fwd = bwd = step = 0.0
        for op in dense_operators(model, dims, local):
            if op.where == "step":
                step += operators.one(op.kind, op.features)
            else:
                fwd += operators.one(op.kind, op.features, "fwd_ms")
                bwd += operators.one(op.kind, op.features, "bwd_ms")
        row = {"emb_fwd_ms": share * compute[rank], "fwd_comm_ms": float(fwd_x[rank]), "dense_fwd_ms": fwd,
               "dense_bwd_ms": bwd, "dense_allreduce_ms": allreduce, "optimizer_ms": step,
               "bwd_comm_ms": float(bwd_x[rank]), "emb_bwd_ms": (1.0 - share) * compute[rank],
               "input_ms": operators.one("input", input_features(plan, tables, rank, batch)),
               "sync_ms": barrier, "other_ms": 0.0}
        if replicated is not None:
            row["allreduce_ms"] = replicated
        durations.append(row)
    return durations, sim


def estimate_iteration(plan: Plan, tables: TableSet, cost_models: CostModels, operators: OperatorModels,
                       model: ModelSpec = DEFAULT_MODEL, batch_size: int | None = None) -> IterationEstimate:
    """The predicted step of ``plan`` training ``model`` at ``batch_size`` (default: the
    tables' batch) on the included runtime (module docstring): the operators' durations, the
    overheads measured in real runs added (``OperatorModels.with_overheads``), the critical path."""
    batch = int(batch_size or tables.batch_size)
    durations, sim = operator_durations(plan, tables, cost_models, operators, model, batch)
    durations, overheads = operators.with_overheads(durations)
    per_rank, path, path_ms = critical_path(durations)
    period = operators.with_period(path_ms, plan.num_devices)
    for row in per_rank:  # the stretch of ranks sharing the machine (STRETCH_TERMS)
        spread_stretch(row, period - path_ms, STRETCH_TERMS if plan.num_devices > 1 else ("sync_ms",))
    sources = {"embedding": f"{cost_models.name} ({sim.comm_source})",
               "operators": operators.hardware_.get("cpu_model", "unknown hardware"),
               "overheads": overheads,
               "gpu_terms": "not measured here (kernel launches, CUDA streams): the included runtime runs on CPU"}
    shared = shared_cores_note(plan.num_devices, operators.hardware_)
    if shared:
        sources["shared_cores"] = shared
    return IterationEstimate(period, per_rank, path, batch, model, sources)


def shared_cores_note(ranks: int, hardware: dict) -> str | None:
    """What an estimate of ``ranks`` processes on the machine of ``hardware`` (an operator file's)
    cannot see when it has fewer cores than ranks, or None. The overheads fitted there carry the
    sharing as an average, so the step is predicted about as well (3 ranks on 2 cores: GMAE 3.0-4.3%,
    docs/decisions.md#turns-of-three-steps), but the ranks then train at about the pace of their summed work and
    the critical path ranks plans poorly (the plan predicted fastest measured 2.5% over the fastest on
    average, at 2 processes 1.2%)."""
    cores = hardware.get("cpu_count")
    if not isinstance(cores, int) or ranks <= cores:
        return None
    return (f"{ranks} ranks on the {cores} cores the operator costs were measured on: the ranks share cores, "
            f"which the critical path does not model; the step is predicted, comparisons of plans are less "
            f"sure (docs/decisions.md#turns-of-three-steps)")


def spread_stretch(row: dict[str, float], stretch: float, terms: Sequence[str]) -> None:
    """Add ``stretch`` ms to one rank's ``terms`` (those it has) in proportion to their size;
    evenly when they are all zero."""
    held = [t for t in terms if t in row]
    total = sum(max(row[t], 0.0) for t in held)
    for t in held:
        row[t] += stretch * (max(row[t], 0.0) / total if total > 0 else 1.0 / len(held))


def critical_path(durations: Sequence[dict[str, float]]) -> tuple[list[dict[str, float]], list[tuple[int, str, float]], float]:
    """Walk ``STEP_CHAIN`` over every rank's operator ``durations`` (a collective's duration
    is its own, without waiting): (per-rank terms with each collective's waiting added, the
    critical path as ``(rank, term, ms)`` from start to end, the period)."""
    ranks = len(durations)
    clock = np.zeros(ranks)
    terms: list[dict[str, float]] = [{} for _ in range(ranks)]
    # for the walk back: per step of the chain, when each rank started it and (collectives) who came last
    last_arrival: list[int | None] = []
    for term, collective in STEP_CHAIN:
        if not any(term in d for d in durations):
            last_arrival.append(None)
            continue
        own = np.array([d.get(term, 0.0) for d in durations])
        if collective is None:
            for r in range(ranks):
                terms[r][term] = float(own[r])
            clock = clock + own
            last_arrival.append(None)
        else:
            late = int(np.argmax(clock))
            end = clock.max() + own
            for r in range(ranks):
                terms[r][term] = float(end[r] - clock[r])
            clock = end
            last_arrival.append(late)
    end_rank = int(np.argmax(clock))
    path: list[tuple[int, str, float]] = []
    rank = end_rank
    for (term, collective), late in zip(reversed(STEP_CHAIN), reversed(last_arrival)):
        if term not in terms[rank]:
            continue
        if collective is None:
            path.append((rank, term, terms[rank][term]))
        else:
            rank = late if late is not None else rank  # the path enters the collective from its last arrival
            path.append((rank, term, float(durations[rank].get(term, 0.0))))
    path.reverse()
    return terms, path, float(clock.max())
