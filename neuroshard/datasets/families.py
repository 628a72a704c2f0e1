"""Table families for benchmarks: one registry, name -> generator, that ``neuroshard
tables generate --preset NAME`` chooses from, and a sampler of sharding tasks.

Every generator is ``generator(num_tables: int | None, seed: int) -> TableSet``
(``None``: the family's natural count); the same seed gives the same tables.

- ``dlrm-2021``, ``dlrm-2022``: the calibrated generators of ``synthetic``.
- ``criteo-kaggle``: the 26 categorical features of the Criteo Kaggle Display
  Advertising Challenge with their known cardinalities, one lookup per sample,
  width 16 (the DLRM / MLPerf default for Kaggle), Zipf alpha 1.05-1.2 per table.
- ``criteo-terabyte``: the 26 tables of MLPerf DLRM-DCNv2 on Criteo 1TB
  (cardinalities capped at ``max_ind_range`` 40,000,000), width 128, the multi-hot
  sizes as pooling factors (one table with 100 lookups per sample), Zipf alpha
  1.05-1.15 per table.
- ``broad``: rows log-uniform over 1e3..1e7, widths 16/32/64/128, pooling factors
  lognormal around 2 clipped to [0.01, 200], Zipf alpha uniform 0.5-1.4.
- ``hot-few``: 2-4 huge hot tables (1e7..6e7 rows, 30-100 lookups, width 64/128)
  at random positions among small cold ones (1e2..1e5 rows, 0.1-3 lookups, width 16-64).

For the Criteo families, ``num_tables`` below 26 takes the first tables of the list,
above 26 repeats the list as ``t27``, ``t28``, ...; each table's alpha is drawn from
``(seed, table index)``, so a repeat differs from its original and the first N tables
do not depend on N. Access is Zipf with scattered row order (hashed ids).
"""
from __future__ import annotations

import logging
import math
import zlib
from typing import Callable

import numpy as np

from ..constants import FP32_BYTES, TABLES_BATCH_SIZE
from ..constraints import check_capacity
from ..errors import NeuroShardError
from ..tables import Table, TableSet
from .synthetic import generate as calibrated

log = logging.getLogger(__name__)


#: Criteo Kaggle DAC, features C1..C26: rows per table.
CRITEO_KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
                      27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
#: MLPerf DLRM-DCNv2, Criteo 1TB with max_ind_range 40,000,000: rows per table.
CRITEO_TERABYTE_ROWS = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346,
                        10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
#: MLPerf DLRM-DCNv2 multi-hot sizes: lookups per sample per table.
CRITEO_TERABYTE_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)

Generator = Callable[[int | None, int], TableSet]


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _count(name: str, num_tables: int | None, natural: int) -> int:
    count = natural if num_tables is None else int(num_tables)
    if count < 1:
        raise NeuroShardError(f"preset {name}: num_tables must be >= 1, got {num_tables}")
    return count


def _zipf(alpha: float) -> dict:
    return {"zipf_alpha": round(float(alpha), 3), "row_order": "scattered"}


def _table_set(name: str, count: int, seed: int, tables: list[Table]) -> TableSet:
    log.info("generated %d tables for preset %s (seed %d)", count, name, seed)
    return TableSet(f"{name}-t{count}-s{seed}", tables, TABLES_BATCH_SIZE, {"synthetic": {"preset": name, "seed": seed}})


def _criteo(name: str, rows: tuple[int, ...], dim: int, pooling: tuple[float, ...],
            alpha: tuple[float, float]) -> Generator:
    """A fixed list of tables: the first N, or the list repeated with new alphas."""
    def generate(num_tables: int | None, seed: int) -> TableSet:
        count = _count(name, num_tables, len(rows))
        tables = []
        for i in range(count):
            k = i % len(rows)
            a = np.random.default_rng([seed, i]).uniform(*alpha)
            tables.append(Table(f"t{i + 1}", rows[k], dim, float(pooling[k]), _zipf(a), {"feature": f"C{k + 1}"}))
        return _table_set(name, count, seed, tables)
    return generate


def broad(num_tables: int | None, seed: int) -> TableSet:
    """Rows over four orders of magnitude, all widths, pooling from ~0 to 100+."""
    count = _count("broad", num_tables, 100)
    rng = np.random.default_rng([seed, zlib.crc32(b"broad")])
    rows = np.round(10 ** rng.uniform(3, 7, count)).astype(np.int64)
    dims = rng.choice((16, 32, 64, 128), size=count)
    pooling = np.clip(rng.lognormal(math.log(2.0), 1.6, count), 0.01, 200)
    alphas = rng.uniform(0.5, 1.4, count)
    width = len(str(count - 1))
    tables = [Table(f"t{i:0{width}d}", int(rows[i]), int(dims[i]), _sig(pooling[i]), _zipf(alphas[i]))
              for i in range(count)]
    return _table_set("broad", count, seed, tables)


def hot_few(num_tables: int | None, seed: int) -> TableSet:
    """2-4 huge hot tables among many small cold ones."""
    count = _count("hot-few", num_tables, 40)
    rng = np.random.default_rng([seed, zlib.crc32(b"hot-few")])
    hot = np.zeros(count, dtype=bool)
    hot[rng.choice(count, size=min(count, int(rng.integers(2, 5))), replace=False)] = True
    rows = np.where(hot, 10 ** rng.uniform(7, math.log10(6e7), count), 10 ** rng.uniform(2, 5, count))
    dims = np.where(hot, rng.choice((64, 128), size=count), rng.choice((16, 32, 64), size=count))
    pooling = np.where(hot, rng.uniform(30, 100, count), 10 ** rng.uniform(-1, math.log10(3), count))
    alphas = np.where(hot, rng.uniform(1.0, 1.2, count), rng.uniform(0.5, 1.1, count))
    width = len(str(count - 1))
    tables = [Table(f"t{i:0{width}d}", int(round(rows[i])), int(dims[i]), _sig(pooling[i]), _zipf(alphas[i]))
              for i in range(count)]
    return _table_set("hot-few", count, seed, tables)


def _calibrated(name: str) -> Generator:
    def generate(num_tables: int | None, seed: int) -> TableSet:
        return calibrated(name, num_tables=num_tables, seed=seed)
    return generate


#: Every preset of ``neuroshard tables generate``, by name.
FAMILIES: dict[str, Generator] = {
    "dlrm-2021": _calibrated("dlrm-2021"),
    "dlrm-2022": _calibrated("dlrm-2022"),
    "criteo-kaggle": _criteo("criteo-kaggle", CRITEO_KAGGLE_ROWS, 16, (1.0,) * 26, (1.05, 1.2)),
    "criteo-terabyte": _criteo("criteo-terabyte", CRITEO_TERABYTE_ROWS, 128, CRITEO_TERABYTE_POOLING, (1.05, 1.15)),
    "broad": broad,
    "hot-few": hot_few,
}
#: Families whose natural tables are a fixed list (tasks draw subsets of it).
_FIXED_LISTS = {"criteo-kaggle": len(CRITEO_KAGGLE_ROWS), "criteo-terabyte": len(CRITEO_TERABYTE_ROWS)}


def generate(family: str, num_tables: int | None = None, seed: int = 0) -> TableSet:
    """Tables of a family (``None``: its natural count); same seed, same tables."""
    if family not in FAMILIES:
        raise NeuroShardError(f"unknown preset {family!r}; choose one of {', '.join(sorted(FAMILIES))}")
    return FAMILIES[family](num_tables, seed)


def family_tasks(family: str, num_devices: int, num_tasks: int, tables_per_device: tuple[int, int] = (10, 40),
                 memory_headroom: tuple[float, float] = (1.2, 1.5),
                 seed: int = 0) -> list[tuple[TableSet, int]]:
    """Sharding tasks from a family: (tables, memory_bytes_per_device) pairs.

    Task ``i`` has ``U{tables_per_device} x num_devices`` tables, generated with a seed
    drawn from ``(seed, family, num_devices, i)`` (a fixed-list family larger than the
    task: a random subset of its list, without replacement). Memory per device is the
    tables' fp32 bytes x ``U{memory_headroom}`` / ``num_devices``; tables larger than
    one device are kept (the planner splits them). Every task passes ``constraints.check_capacity``
    with row splits."""
    if family not in FAMILIES:
        raise NeuroShardError(f"unknown preset {family!r}; choose one of {', '.join(sorted(FAMILIES))}")
    lo, hi = tables_per_device
    if num_devices < 1 or num_tasks < 0 or not 1 <= lo <= hi:
        raise NeuroShardError(f"family_tasks: need num_devices >= 1, num_tasks >= 0 and 1 <= tables_per_device[0] "
                              f"<= tables_per_device[1]; got {num_devices}, {num_tasks}, {tables_per_device}")
    if not 1.0 <= memory_headroom[0] <= memory_headroom[1]:
        raise NeuroShardError(f"family_tasks: memory_headroom must be 1 <= low <= high, got {memory_headroom}")
    tasks = []
    for i in range(num_tasks):
        rng = np.random.default_rng([seed, zlib.crc32(family.encode()), num_devices, i])
        count = int(rng.integers(lo, hi + 1)) * num_devices
        task_seed = int(rng.integers(2**31))
        fixed = _FIXED_LISTS.get(family, 0)
        pool = generate(family, max(count, fixed), task_seed)
        tables = pool.tables
        if count < fixed:
            tables = [pool[int(j)] for j in np.sort(rng.choice(fixed, size=count, replace=False))]
        headroom = float(rng.uniform(*memory_headroom))
        total = sum(t.size_bytes(FP32_BYTES) for t in tables)
        memory = int(math.ceil(total * headroom / num_devices))
        name = f"{family}-d{num_devices}-task{i:03d}"
        extra = {"synthetic": {"preset": family, "seed": task_seed},
                 "task": {"family": family, "num_devices": num_devices, "index": i, "seed": seed,
                          "memory_headroom": round(headroom, 4), "device_memory_bytes": memory}}
        task = TableSet(name, tables, pool.batch_size, extra)
        check_capacity(task, num_devices, memory, FP32_BYTES, row_splits=True)
        tasks.append((task, memory))
    return tasks
