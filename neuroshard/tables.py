"""Tables to be sharded: ``Table``, ``TableSet`` and the ``neuroshard.tables/v1`` file."""
from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from .datasets import access as acc
from .datasets.lookup_cache import cached, sampling_key
from .errors import FormatError
from .validate import (MAX_BATCH_SIZE, MAX_EMBEDDING_DIM, MAX_LOOKUPS_PER_BATCH, MAX_NUM_EMBEDDINGS,
                       MAX_POOLING_FACTOR, MAX_TABLES, read_json)

TABLES_FORMAT = "neuroshard.tables/v1"
DEFAULT_BATCH_SIZE = 65536
ROW_ORDERS = ("scattered", "hottest_first")
_TABLE_KEYS = ("name", "num_embeddings", "embedding_dim", "pooling_factor", "access")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Table:
    """One embedding table: ``num_embeddings`` rows of ``embedding_dim`` columns,
    looked up ``pooling_factor`` times per sample with the given ``access`` distribution."""

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float
    access: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict, repr=False)
    base_dir: Path | None = field(default=None, repr=False, compare=False)
    source: str | None = field(default=None, repr=False, compare=False)  # where it was read, for errors

    # ---------------------------------------------------------------- format
    @classmethod
    def from_dict(cls, data: Any, where: str = "table") -> "Table":
        """Read one entry of the ``tables`` list; ``where`` names it in errors."""
        if not isinstance(data, Mapping):
            raise FormatError(f"{where}: must be an object, got {type(data).__name__}")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise FormatError(f"{where}: field 'name' must be a non-empty string, got {name!r}")
        where = f"{where} '{name}'"
        for key, check, what, high, limit in (
            ("num_embeddings", lambda v: _is_int(v) and v >= 1, "an integer >= 1", MAX_NUM_EMBEDDINGS,
             "MAX_NUM_EMBEDDINGS"),
            ("embedding_dim", lambda v: _is_int(v) and v >= 1, "an integer >= 1", MAX_EMBEDDING_DIM,
             "MAX_EMBEDDING_DIM"),
            ("pooling_factor", lambda v: _is_number(v) and v >= 0, "a number >= 0", MAX_POOLING_FACTOR,
             "MAX_POOLING_FACTOR"),
        ):
            if key not in data:
                raise FormatError(f"{where}: field '{key}' is missing")
            if not check(data[key]):
                raise FormatError(f"{where}: field '{key}' must be {what}, got {data[key]!r}")
            if data[key] > high:
                raise FormatError(f"{where}: field '{key}' is {data[key]!r}, over the limit of {high:.15g} ({limit})")
        access = data.get("access", {})
        access = {} if access is None else access
        _check_access(access, where)
        extra = {k: v for k, v in data.items() if k not in _TABLE_KEYS}
        return cls(name, int(data["num_embeddings"]), int(data["embedding_dim"]),
                   float(data["pooling_factor"]), dict(access), extra, source=where)

    def to_dict(self) -> dict:
        out = {"name": self.name, "num_embeddings": self.num_embeddings,
               "embedding_dim": self.embedding_dim, "pooling_factor": self.pooling_factor}
        if self.access:
            out["access"] = self.access
        out.update(self.extra)
        return out

    # -------------------------------------------------------------- features
    def size_bytes(self, bytes_per_element: int = 4) -> int:
        return self.num_embeddings * self.embedding_dim * bytes_per_element

    @property
    def row_order(self) -> str:
        return self.access.get("row_order", "scattered")

    def _seed(self) -> int:
        return zlib.crc32(self.name.encode())

    def sample_lookups(self, batch_size: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One batch of lookups: (row ids, lengths per sample), deterministic for a seed
        (default: derived from the table's name); cached (``datasets.lookup_cache``)."""
        return cached((*sampling_key(self), "batch", batch_size, seed), lambda: self.draw_lookups(batch_size, seed))

    def draw_lookups(self, batch_size: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``sample_lookups`` without the cache (a training step's batch, used once)."""
        rng = np.random.default_rng(self._seed() if seed is None else seed)
        if "indices" in self.access:
            from .datasets.dlrm import recorded_batch
            return recorded_batch(self, batch_size, rng)
        num = int(round(batch_size * self.pooling_factor))
        rows = acc.sample_rows(self.access, self.num_embeddings, num, rng)
        return rows, acc.lengths_for(num, batch_size, rng)

    def reuse_histograms(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(share of distinct rows per reuse bin, share of lookups per bin, mean reuse) in
        one batch: from the file's histogram when given, else from a sampled batch."""
        def compute() -> tuple[np.ndarray, np.ndarray, float]:
            if "reuse_histogram" in self.access:
                distinct = np.asarray(self.access["reuse_histogram"], dtype=np.float64)
                distinct = distinct / distinct.sum()
                lookups, implied = acc.lookup_share_from_distinct(distinct)
                return distinct, lookups, float(self.access.get("mean_reuse", implied))
            return acc.reuse_histograms(self.sample_lookups(batch_size)[0])
        return cached((*sampling_key(self), "hist", batch_size), compute)

    def reuse_histogram(self, batch_size: int) -> np.ndarray:
        """The 17-bin share of distinct rows per reuse bin in one batch."""
        return self.reuse_histograms(batch_size)[0]

    def shard(self, row_offset: int, num_rows: int, col_offset: int, num_cols: int,
              batch_size: int) -> "Table":
        """The part of this table a shard holds, as a table of its own (rows, width,
        lookups per sample and reuse as that shard sees them)."""
        name = self.name if (num_rows, num_cols) == (self.num_embeddings, self.embedding_dim) \
            else f"{self.name}[{row_offset}:{row_offset + num_rows},{col_offset}:{col_offset + num_cols}]"
        if num_rows == self.num_embeddings:
            return Table(name, num_rows, num_cols, self.pooling_factor, dict(self.access), base_dir=self.base_dir)

        def compute() -> tuple[float, np.ndarray, float]:
            rows = self.sample_lookups(batch_size)[0]
            inside = rows[(rows >= row_offset) & (rows < row_offset + num_rows)]
            distinct, _, mean_reuse = acc.reuse_histograms(inside)
            if inside.size == 0:
                distinct[0] = 1.0
                mean_reuse = 1.0
            return inside.size / batch_size, distinct, mean_reuse
        pooling, distinct, mean_reuse = cached((*sampling_key(self), "rows", batch_size, row_offset, num_rows),
                                               compute)
        access = {"reuse_histogram": [round(float(x), 6) for x in distinct], "mean_reuse": mean_reuse}
        return Table(name, num_rows, num_cols, float(pooling), access)


def _check_access(access: Any, where: str) -> None:
    if not isinstance(access, Mapping):
        raise FormatError(f"{where}: field 'access' must be an object, got {access!r}")
    if "zipf_alpha" in access and not (_is_number(access["zipf_alpha"]) and access["zipf_alpha"] >= 0):
        raise FormatError(f"{where}: field 'access.zipf_alpha' must be a number >= 0, got {access['zipf_alpha']!r}")
    if "reuse_histogram" in access:
        hist = access["reuse_histogram"]
        if (not isinstance(hist, list) or len(hist) != acc.NUM_BINS
                or not all(_is_number(x) and x >= 0 for x in hist) or sum(hist) <= 0):
            raise FormatError(f"{where}: field 'access.reuse_histogram' must be {acc.NUM_BINS} "
                              f"numbers >= 0 with a positive sum")
    if "mean_reuse" in access and not (_is_number(access["mean_reuse"]) and access["mean_reuse"] >= 1):
        raise FormatError(f"{where}: field 'access.mean_reuse' must be a number >= 1, got {access['mean_reuse']!r}")
    if "indices" in access and not isinstance(access["indices"], str):
        raise FormatError(f"{where}: field 'access.indices' must be a file path, got {access['indices']!r}")
    if access.get("row_order", "scattered") not in ROW_ORDERS:
        raise FormatError(f"{where}: field 'access.row_order' must be one of {ROW_ORDERS}, got {access['row_order']!r}")


@dataclass
class TableSet:
    """The tables of one model, with the batch size they are trained at."""

    name: str
    tables: list[Table]
    batch_size: int = DEFAULT_BATCH_SIZE
    extra: dict = field(default_factory=dict, repr=False)
    path: Path | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name = {t.name: t for t in self.tables}

    def __iter__(self) -> Iterator[Table]:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    def __getitem__(self, key: int | str) -> Table:
        if isinstance(key, str):
            return self._by_name[key]
        return self.tables[key]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    # ---------------------------------------------------------------- format
    @classmethod
    def from_dict(cls, data: Any, source: str = "<tables>", base_dir: Path | None = None) -> "TableSet":
        if not isinstance(data, Mapping):
            raise FormatError(f"{source}: a tables file must be a JSON object")
        fmt = data.get("format")
        if fmt != TABLES_FORMAT:
            raise FormatError(f"{source}: field 'format' is {fmt!r}; this version of neuroshard reads {TABLES_FORMAT!r}")
        batch_size = data.get("batch_size", DEFAULT_BATCH_SIZE)
        if not (_is_int(batch_size) and 1 <= batch_size <= MAX_BATCH_SIZE):
            raise FormatError(f"{source}: field 'batch_size' must be an integer in [1, {MAX_BATCH_SIZE}] "
                              f"(MAX_BATCH_SIZE), got {batch_size!r}")
        name = data.get("name", Path(source).stem if source != "<tables>" else "tables")
        if not isinstance(name, str):
            raise FormatError(f"{source}: field 'name' must be a string, got {name!r}")
        entries = data.get("tables")
        if not isinstance(entries, list) or not entries:
            raise FormatError(f"{source}: field 'tables' must be a non-empty list")
        if len(entries) > MAX_TABLES:
            raise FormatError(f"{source}: {len(entries)} tables, over the limit of {MAX_TABLES} (MAX_TABLES); "
                              f"split the file")
        tables, seen = [], set()
        for i, entry in enumerate(entries):
            table = Table.from_dict(entry, where=f"{source}: table #{i}")
            if table.name in seen:
                raise FormatError(f"{source}: table #{i} '{table.name}': duplicate name")
            if batch_size * table.pooling_factor > MAX_LOOKUPS_PER_BATCH:
                raise FormatError(f"{source}: table #{i} '{table.name}': field 'pooling_factor' "
                                  f"{table.pooling_factor:g} x batch size {batch_size} is over "
                                  f"{MAX_LOOKUPS_PER_BATCH} lookups per batch (MAX_LOOKUPS_PER_BATCH)")
            seen.add(table.name)
            table.base_dir = base_dir
            tables.append(table)
        extra = {k: v for k, v in data.items() if k not in ("format", "name", "batch_size", "tables")}
        return cls(name, tables, int(batch_size), extra)

    @classmethod
    def read(cls, path: str | Path) -> "TableSet":
        """Read and validate a tables file; FormatError names the file, table and field."""
        path = Path(path)
        data = read_json(path, "tables file")
        tables = cls.from_dict(data, source=str(path), base_dir=path.parent.resolve())
        tables.path = path
        return tables

    def to_dict(self) -> dict:
        out = {"format": TABLES_FORMAT, "name": self.name, "batch_size": self.batch_size}
        out.update(self.extra)
        out["tables"] = [t.to_dict() for t in self.tables]
        return out

    def write(self, path: str | Path) -> Path:
        """Write atomically (a temporary file renamed into place)."""
        from .io import atomic_write_text
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    # --------------------------------------------------------------- summary
    def total_bytes(self, bytes_per_element: int = 4) -> int:
        return sum(t.size_bytes(bytes_per_element) for t in self.tables)

    def summary(self, bytes_per_element: int = 4):
        """One row per table: rows, width, pooling factor, size, mean reuse, share of
        lookups on rows reused more than ``access.HOT_REUSE`` (32) times (skew). A pandas DataFrame."""
        import pandas as pd
        rows = []
        for t in self.tables:
            _, lookup_share, mean_reuse = t.reuse_histograms(self.batch_size)
            rows.append({"table": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
                         "pooling_factor": t.pooling_factor, "size_bytes": t.size_bytes(bytes_per_element),
                         "mean_reuse": mean_reuse, "hot_lookup_share": float(lookup_share[acc.HOT_FIRST_BIN:].sum())})
        return pd.DataFrame(rows)
