"""Tables to be sharded: ``Table``, ``TableSet`` and the ``neuroshard.tables/v1`` file."""
from __future__ import annotations

import difflib
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from .access_spec import NUM_BINS, ROW_ORDERS
from .constants import FP32_BYTES, TABLES_BATCH_SIZE
from .constraints import check_constraints
from .errors import FormatError
from .io import atomic_write_text
from .validate import (
    MAX_BATCH_SIZE,
    MAX_EMBEDDING_DIM,
    MAX_LOOKUPS_PER_BATCH,
    MAX_NUM_EMBEDDINGS,
    MAX_POOLING_FACTOR,
    MAX_TABLES,
    check_format,
    check_name,
    is_int,
    is_number,
    read_json,
)

TABLES_FORMAT = "neuroshard.tables/v1"
_TABLE_KEYS = ("name", "num_embeddings", "embedding_dim", "pooling_factor", "access", "constraints")
#: the keys of a table's ``access`` (docs/formats.md): any other is warned about as read
ACCESS_KEYS = ("zipf_alpha", "reuse_histogram", "mean_reuse", "indices", "table_index", "row_order")
_FILE_KEYS = ("format", "name", "batch_size", "tables")

log = logging.getLogger(__name__)


@dataclass
class Table:
    """One embedding table: ``num_embeddings`` rows of ``embedding_dim`` columns,
    looked up ``pooling_factor`` times per sample with the given ``access`` distribution.
    A plain record: sampling its lookups is ``neuroshard.datasets.sampler``'s business."""

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float
    access: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict, repr=False)
    base_dir: Path | None = field(default=None, repr=False, compare=False)
    source: str | None = field(default=None, repr=False, compare=False)  # where it was read, for errors
    constraints: dict = field(default_factory=dict)  # the file's per-table constraints (``neuroshard.constraints``)

    # ---------------------------------------------------------------- format
    @classmethod
    def from_dict(cls, data: Any, where: str = "table") -> "Table":
        """Read one entry of the ``tables`` list; ``where`` names it in errors."""
        if not isinstance(data, Mapping):
            raise FormatError(f"{where}: must be an object, got {type(data).__name__}")
        if "name" not in data:
            raise _missing(where, "name", data, _TABLE_KEYS, "table")
        name = check_name(data.get("name"), where)
        where = f"{where} '{name}'"
        for key, check, what, high, limit in (
            ("num_embeddings", lambda v: is_int(v) and v >= 1, "an integer >= 1", MAX_NUM_EMBEDDINGS,
             "MAX_NUM_EMBEDDINGS"),
            ("embedding_dim", lambda v: is_int(v) and v >= 1, "an integer >= 1", MAX_EMBEDDING_DIM,
             "MAX_EMBEDDING_DIM"),
            ("pooling_factor", lambda v: is_number(v) and v >= 0, "a number >= 0", MAX_POOLING_FACTOR,
             "MAX_POOLING_FACTOR"),
        ):
            if key not in data:
                raise _missing(where, key, data, _TABLE_KEYS, "table")
            if not check(data[key]):
                raise FormatError(f"{where}: field '{key}' must be {what}, got {data[key]!r}")
            if data[key] > high:
                raise FormatError(f"{where}: field '{key}' is {data[key]!r}, over the limit of {high:.15g} ({limit})")
        access = data.get("access", {})
        access = {} if access is None else access
        _check_access(access, where)
        constraints = check_constraints(data["constraints"], where) if data.get("constraints") is not None else {}
        extra = {k: v for k, v in data.items() if k not in _TABLE_KEYS}
        return cls(name, int(data["num_embeddings"]), int(data["embedding_dim"]),
                   float(data["pooling_factor"]), dict(access), extra, source=where, constraints=constraints)

    def to_dict(self) -> dict:
        out = {"name": self.name, "num_embeddings": self.num_embeddings,
               "embedding_dim": self.embedding_dim, "pooling_factor": self.pooling_factor}
        if self.access:
            out["access"] = self.access
        if self.constraints:  # absent when none: written as a table without constraints
            out["constraints"] = self.constraints
        out.update(self.extra)
        return out

    # ---------------------------------------------------------------- derived
    def size_bytes(self, bytes_per_element: int = FP32_BYTES) -> int:
        return self.num_embeddings * self.embedding_dim * bytes_per_element

    @property
    def row_order(self) -> str:
        return self.access.get("row_order", "scattered")


def _check_access(access: Any, where: str) -> None:
    if not isinstance(access, Mapping):
        raise FormatError(f"{where}: field 'access' must be an object, got {access!r}")
    if "zipf_alpha" in access and not (is_number(access["zipf_alpha"]) and access["zipf_alpha"] >= 0):
        raise FormatError(f"{where}: field 'access.zipf_alpha' must be a number >= 0, got {access['zipf_alpha']!r}")
    if "reuse_histogram" in access:
        hist = access["reuse_histogram"]
        if (not isinstance(hist, list) or len(hist) != NUM_BINS
                or not all(is_number(x) and x >= 0 for x in hist) or sum(hist) <= 0):
            raise FormatError(f"{where}: field 'access.reuse_histogram' must be {NUM_BINS} "
                              f"numbers >= 0 with a positive sum")
    if "mean_reuse" in access and not (is_number(access["mean_reuse"]) and access["mean_reuse"] >= 1):
        raise FormatError(f"{where}: field 'access.mean_reuse' must be a number >= 1, got {access['mean_reuse']!r}")
    if "indices" in access and not isinstance(access["indices"], str):
        raise FormatError(f"{where}: field 'access.indices' must be a file path, got {access['indices']!r}")
    if access.get("row_order", "scattered") not in ROW_ORDERS:
        raise FormatError(f"{where}: field 'access.row_order' must be one of {ROW_ORDERS}, got {access['row_order']!r}")


def _like(key: str, known: tuple[str, ...]) -> str | None:
    """The known key ``key`` is probably a misspelling of, or None."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return close[0] if close else None


def _typo(key: str, data: Mapping, known: tuple[str, ...]) -> str | None:
    """An unknown key of ``data`` that looks like a misspelling of ``key`` (``_like``), or None."""
    return next((k for k in data if k not in known and isinstance(k, str) and _like(k, (key,))), None)


def _missing(where: str, key: str, data: Mapping, known: tuple[str, ...], what: str) -> FormatError:
    """The error of a required ``key`` missing from ``data``, with the did-you-mean optional
    keys get when an unknown key of ``data`` looks like a misspelling of it (``_typo``)."""
    typo = _typo(key, data, known)
    hint = f" (the {what} has '{typo}': did you mean '{key}'?)" if typo is not None else ""
    return FormatError(f"{where}: field '{key}' is missing{hint}")


def _warn_unknown_keys(source: str, has_batch: bool, tables: list["Table"], extra: dict) -> None:
    """One warning per finding, for the whole file (docs/formats.md): no ``batch_size``; a key
    of the file or of a table that looks like a misspelt known key (other extra keys are
    kept silently, as the format allows); any unknown key of ``access`` (a closed list)."""
    if not has_batch:
        log.warning("%s: no 'batch_size': reading it as the global batch of %d samples (TABLES_BATCH_SIZE); "
                    "state the batch you train at (all ranks together)", source, TABLES_BATCH_SIZE)
    findings = [(key, like, "the file") for key in extra if (like := _like(key, _FILE_KEYS))]
    counts = Counter((key, like) for t in tables for key in t.extra if (like := _like(key, _TABLE_KEYS)))
    counts += Counter((f"access.{key}", _like(key, ACCESS_KEYS)) for t in tables for key in t.access
                      if key not in ACCESS_KEYS)
    findings += [(key, like, f"{n} table{'s' if n > 1 else ''}") for (key, like), n in counts.items()]
    for key, like, where in findings:
        hint = f"did you mean '{like}'?" if like else f"known: {', '.join(ACCESS_KEYS)}"
        log.warning("%s: key '%s' in %s is not read (%s); it is kept as an extra key", source, key, where, hint)


@dataclass
class TableSet:
    """The tables of one model, with the batch size they are trained at."""

    name: str
    tables: list[Table]
    batch_size: int = TABLES_BATCH_SIZE
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
        for key in ("format", "tables"):  # a misspelt required key: did you mean
            if key not in data and _typo(key, data, _FILE_KEYS):
                raise _missing(source, key, data, _FILE_KEYS, "file")
        check_format(data, TABLES_FORMAT, source)
        batch_size = data.get("batch_size", TABLES_BATCH_SIZE)
        if not (is_int(batch_size) and 1 <= batch_size <= MAX_BATCH_SIZE):
            raise FormatError(f"{source}: field 'batch_size' must be an integer in [1, {MAX_BATCH_SIZE}] "
                              f"(MAX_BATCH_SIZE), got {batch_size!r}")
        name = check_name(data.get("name", Path(source).stem if source != "<tables>" else "tables"), source, empty=True)
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
        extra = {k: v for k, v in data.items() if k not in _FILE_KEYS}
        _warn_unknown_keys(source, "batch_size" in data, tables, extra)
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
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    def at_batch(self, batch_size: int) -> "TableSet":
        """The same tables (name, extra keys) at another global batch size (the tables are shared)."""
        return TableSet(self.name, list(self.tables), batch_size, self.extra)

    # --------------------------------------------------------------- summary
    def total_bytes(self, bytes_per_element: int = FP32_BYTES) -> int:
        return sum(t.size_bytes(bytes_per_element) for t in self.tables)
