"""What ``neuroshard pretrain --here`` measures, and how much of it the budget buys.

The families collected (``TRAINING_FAMILIES``) and the ones never collected
(``HELD_OUT_FAMILIES``); the profiles (``PROFILES``: ``default``, and ``tiny`` for a smoke test)
with their compute collections; the budget's shares per stage (``SHARES``) and the sizing of the
stages that are sized rather than timed (``dense_size``, ``choose_overhead_configs``, at the pace
``machine_pace`` measures); and the tables files each collection draws from (``write_pools``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..constants import MEASURED_BATCH_SIZE
from ..datasets.families import generate
from ..tables import Table, TableSet

#: the families collected: the benchmark's held-out families are not among them
TRAINING_FAMILIES = ("dlrm-2021", "dlrm-2022", "broad")
#: never collected here: the held-out families of the benchmark that judges the model
HELD_OUT_FAMILIES = ("criteo-kaggle", "criteo-terabyte", "hot-few")
#: the default wall-clock budget (minutes): the command finishes within 30 on a 2-core machine
DEFAULT_MINUTES = 25.0
#: each stage's share of the budget (the rest: start-up, table generation, the report)
SHARES = {"compute": 0.48, "comm": 0.08, "fit": 0.08, "dense": 0.16, "overheads": 0.14}
#: ``collect dense``'s full size takes about this long on a quiet 2-core machine: the dense
#: stage measures the share of it that its budget buys (at least ``MIN_DENSE_FRACTION``)
DENSE_FULL_SECONDS = 300.0
MIN_DENSE_FRACTION = 0.2
#: one overhead configuration (4 plans trained together, 12 iterations) on a 2-core machine
OVERHEAD_CONFIG_SECONDS = 25.0
#: the slowest pace ``machine_pace`` reports
MAX_PACE = 10.0
#: a collection stops at this many samples if its time share has not stopped it before
CEILING_COMPUTE_SETS = 2000
CEILING_COMM_SAMPLES = 300
#: fewest exchange samples per device count (a fifth is held out; the tree model needs 4 to fit)
MIN_COMM_SAMPLES = 6
#: fewest shard sets a fit takes (``costmodels.pretrain`` holds out a fifth, then validates on 10 of
#: the rest, and a neural model fits on 4 at least)
MIN_COMPUTE_SETS = 18
#: the most processes the exchange is timed at
MAX_COMM_DEVICES = 4
#: sets of tables from several families (the hot collection's) are reported under this name
MIXED = "mixed"


# ------------------------------------------------------------------ profiles
@dataclass(frozen=True)
class Collection:
    """One compute folder: its tables file, which sets (``plans`` or ``random``), its weight in
    the compute share, and ``collect_compute``'s settings."""

    name: str
    tables: str
    sets: str
    weight: float
    options: dict


@dataclass(frozen=True)
class Profile:
    """What is measured and how (a folder measured under one profile is refused by another:
    each profile has its own data folder). ``default`` is the real thing; ``tiny`` is a smoke
    test of the command (a minute or two), whose model is not worth searching with."""

    name: str
    tables_per_family: int
    family_seeds: dict
    heavy_tables: int            # of each family's pool: the heaviest (rows x lookups) go to the hot pool
    collections: tuple
    comm: dict                   # collect_comm's settings
    compute_sets: int | None     # None: the time share decides (up to CEILING_COMPUTE_SETS a folder)
    comm_samples: int | None
    dense: dict | None           # collect_dense's size (None: scaled to the budget)
    overhead_configs: int | None  # None: as many as the budget buys
    overhead_iterations: int
    epochs: int
    ensemble: int


def _collections(random: dict, hot: dict, plans: dict) -> tuple:
    out = []
    for family in TRAINING_FAMILIES:
        out.append(Collection(f"plans-{family}", f"{family}.json", "plans", 2.0, plans))
        out.append(Collection(f"random-{family}", f"{family}.json", "random", 2.3, random))
    out.append(Collection("hot", "hot.json", "random", 2.1, hot))
    return tuple(out)


_TIMING = {"repeats": 3, "max_repeats": 5}
PROFILES: dict[str, Profile] = {
    "default": Profile(
        "default", 120, {"dlrm-2021": 4001, "dlrm-2022": 4002, "broad": 4003}, 16,
        _collections(random={"max_tables": 80, "memory_bytes": 3 << 30, "row_split_prob": 0.3, **_TIMING},
                     hot={"max_tables": 80, "memory_bytes": 4 << 30, "row_split_prob": 0.4, **_TIMING},
                     plans={"memory_bytes": 64 << 30, **_TIMING}),
        comm={}, compute_sets=None, comm_samples=None, dense=None, overhead_configs=None, overhead_iterations=12,
        epochs=80, ensemble=3),
    "tiny": Profile(
        "tiny", 12, {"dlrm-2021": 4001, "dlrm-2022": 4002, "broad": 4003}, 3,
        _collections(random={"max_tables": 6, "memory_bytes": 256 << 20, "row_split_prob": 0.3, "warmup": 1,
                             "repeats": 1, "max_repeats": 1},
                     hot={"max_tables": 6, "memory_bytes": 512 << 20, "row_split_prob": 0.5, "warmup": 1,
                          "repeats": 1, "max_repeats": 1},
                     plans={"memory_bytes": 64 << 30, "warmup": 1, "repeats": 1, "max_repeats": 1}),
        comm={"warmup": 1, "repeats": 3}, compute_sets=18, comm_samples=MIN_COMM_SAMPLES,
        dense={"layers": {"count": 12, "rounds": 1, "min_ms": 0.5}, "optimizer": {"count": 6, "rounds": 1},
               "input": {"count": 6, "rounds": 1},
               "collectives": {"ranks": (2,), "rounds": 1, "sizes": [4096, 1 << 20]},
               "embedding_split": {"count": 2}},
        overhead_configs=1, overhead_iterations=4, epochs=5, ensemble=2),
}


def dense_fraction(seconds: float) -> float:
    """The share of ``collect dense``'s full size that ``seconds`` buy (``DENSE_FULL_SECONDS`` for all)."""
    return float(np.clip(seconds / DENSE_FULL_SECONDS, MIN_DENSE_FRACTION, 1.0))


def dense_size(seconds: float) -> dict:
    """``collect dense``'s sample counts (and collective rounds) scaled to ``seconds``."""
    f = dense_fraction(seconds)
    return {"layers": {"count": max(12, round(240 * f))}, "optimizer": {"count": max(6, round(40 * f))},
            "input": {"count": max(6, round(60 * f))}, "collectives": {"rounds": max(2, round(5 * f))},
            "embedding_split": {"count": max(3, round(30 * f))}}


def machine_pace(probes: int = 5, seconds: float = 0.3) -> float:
    """How much slower than its own CPU time a single-threaded loop runs now (the median of
    ``probes`` loops of ``seconds``): 1 on an idle core, about the runnable threads per core on a
    loaded machine (3-4 on this project's shared 2-core VM at load 7-10). The stages that are
    sized rather than timed (the operator benchmark, the overhead runs) divide their share by
    it, so a loaded machine measures less instead of overrunning the budget. At most
    ``MAX_PACE``."""
    paces = []
    for _ in range(probes):
        wall, cpu = time.perf_counter(), time.thread_time()
        x = 0
        while time.perf_counter() - wall < seconds:
            for i in range(10_000):
                x += i
        paces.append((time.perf_counter() - wall) / max(time.thread_time() - cpu, 1e-6))
    return float(np.clip(np.median(paces), 1.0, MAX_PACE))


def split_count(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders; each at least 1)."""
    w = np.asarray(weights, dtype=np.float64)
    raw = total * w / w.sum()
    out = np.maximum(np.floor(raw).astype(int), 1)
    for i in np.argsort(-(raw - np.floor(raw))):
        if out.sum() >= total:
            break
        out[i] += 1
    return [int(x) for x in out]


def comm_device_counts(backend: str) -> list[int]:
    """The device counts this machine can run the exchange at: 2 to min(cores, 4) gloo
    processes, or on ``cuda`` 2 to min(GPUs, 4)."""
    if backend == "cuda":
        import torch
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    else:
        available = os.cpu_count() or 1
    return list(range(2, min(available, MAX_COMM_DEVICES) + 1))


def overhead_runs(backend: str, configs: Sequence[tuple]) -> tuple[str, list[tuple]]:
    """The torch.distributed backend of the overheads stage's real runs and the configurations
    it can run (a configuration's last field is its process count): gloo processes of any count
    for ``cpu`` (even on a machine with GPUs), nccl for ``cuda`` with one GPU a process, so only
    configurations of at most the GPUs (none on one GPU: nccl refuses two ranks on one device)."""
    if backend != "cuda":
        return "gloo", list(configs)
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "nccl", [c for c in configs if c[-1] <= gpus]


def choose_overhead_configs(configs: Sequence[tuple], profile: Profile, seconds: float) -> list[tuple]:
    """The overhead configurations of the training families (a configuration is ``(family,
    tables, seed, model, batch, processes)``), alternating process counts, as many as
    ``seconds`` buy (``OVERHEAD_CONFIG_SECONDS`` each, 2 at least: one per process count) or
    the profile fixes."""
    allowed = [c for c in configs if c[0] in TRAINING_FAMILIES]
    by_ranks: dict[int, list[tuple]] = {}
    for c in allowed:
        by_ranks.setdefault(int(c[5]), []).append(c)
    order: list[tuple] = []
    lists = [by_ranks[r] for r in sorted(by_ranks)]
    for i in range(max((len(x) for x in lists), default=0)):
        order += [x[i] for x in lists if i < len(x)]
    count = (profile.overhead_configs if profile.overhead_configs is not None
             else max(2, int(max(seconds, 0.0) // OVERHEAD_CONFIG_SECONDS)))
    return order[:count]


# -------------------------------------------------------------------- tables
def family_of(table_name: str) -> str:
    """The training family a collected table's name starts with (``broad-t012`` -> ``broad``)."""
    for family in sorted(TRAINING_FAMILIES, key=len, reverse=True):
        if table_name.startswith(family + "-"):
            return family
    return MIXED


def write_pools(folder: Path, profile: Profile) -> None:
    """Each training family's tables (named ``<family>-<table>``) and the hot pool (each family's
    ``heavy_tables`` heaviest tables, rows x lookups, beside its smallest), once: a folder keeps
    the files it was measured with (their hash is in every collection's ``meta.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    hot: list[Table] = []
    for family in TRAINING_FAMILIES:
        path = folder / f"{family}.json"
        if path.exists():
            tables = TableSet.read(path).tables
        else:
            generated = generate(family, profile.tables_per_family, profile.family_seeds[family])
            tables = []
            for t in generated:
                t.name = f"{family}-{t.name}"
                tables.append(t)
            TableSet(f"{family}-machine", tables, MEASURED_BATCH_SIZE,
                     {"family": family, "seed": profile.family_seeds[family]}).write(path)
        weight = sorted(tables, key=lambda t: -t.num_embeddings * float(t.pooling_factor))
        small = sorted(weight[profile.heavy_tables:], key=lambda t: t.num_embeddings)
        hot += weight[:profile.heavy_tables] + small[:len(small) // 2]
    path = folder / "hot.json"
    if not path.exists():
        TableSet("hot-beside-small", hot, MEASURED_BATCH_SIZE,
                 {"families": list(TRAINING_FAMILIES), "note": "each family's heaviest tables beside its smallest"}
                 ).write(path)
