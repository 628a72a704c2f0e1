"""Tables from Meta's public dlrm_datasets tensors.

A file holds ``torch.save((indices, offsets, lengths))``, optionally gzip-compressed
(``fbgemm_t856_bs65536.pt.gz``): ``lengths`` is ``[T, B]`` (T tables, B samples),
``offsets`` has ``T*B + 1`` entries into the flattened ``indices``; table ``t``'s
lookups for sample ``s`` are ``indices[offsets[t*B + s] : offsets[t*B + s + 1]]``.

A ``.pt`` file is memory-mapped; a gzip file is decompressed into memory.
"""
from __future__ import annotations

import gzip
import io
import logging
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import FormatError, NeuroShardError
from ..tables import Table, TableSet
from . import access as acc

log = logging.getLogger(__name__)

MIN_ROWS = 100  # as in the NeuroShard paper: a table has at least 100 rows
DEFAULT_DIM = 128
_CACHE_SIZE = 2
_cache: "OrderedDict[tuple, RecordedLookups]" = OrderedDict()


class RecordedLookups:
    """The lookups of one dlrm_datasets file: per-table row ids and lengths ``[T, B]``."""

    def __init__(self, path: Path, indices: np.ndarray, offsets: np.ndarray, lengths: np.ndarray):
        self.path = path
        self.indices = indices
        self.offsets = offsets
        self.lengths = lengths

    @property
    def num_tables(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])

    def table_indices(self, t: int) -> np.ndarray:
        """All row ids of table ``t`` over the recorded batch."""
        b = self.batch_size
        return self.indices[int(self.offsets[t * b]):int(self.offsets[(t + 1) * b])]

    def batch(self, t: int, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(row ids, lengths) of table ``t`` for ``batch_size`` samples: the recorded batch
        itself when sizes match, else samples drawn with replacement."""
        rows, lengths = self.table_indices(t), self.lengths[t]
        if batch_size == self.batch_size:
            return rows.astype(np.int64), lengths.astype(np.int64)
        samples = rng.integers(0, self.batch_size, size=batch_size)
        starts = (self.offsets[t * self.batch_size + samples] - self.offsets[t * self.batch_size]).astype(np.int64)
        picked = lengths[samples].astype(np.int64)
        # positions: for each picked sample, starts[s] + 0..len-1, flattened
        firsts = np.cumsum(picked) - picked
        positions = np.repeat(starts - firsts, picked) + np.arange(int(picked.sum()))
        return rows[positions].astype(np.int64), picked


def _load_tensors(path: Path):
    import torch
    try:
        if _is_gzip(path):
            with gzip.open(path, "rb") as handle:
                return torch.load(io.BytesIO(handle.read()), weights_only=True)
        try:
            return torch.load(path, weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) serialization cannot be memory-mapped
            return torch.load(path, weights_only=True)
    except (OSError, EOFError) as exc:
        raise FormatError(f"{path}: cannot read dlrm_datasets file ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a foreign file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise FormatError(f"{path}: not a torch-saved dlrm_datasets file ({type(exc).__name__}: {first})") from None


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


def _to_numpy(x, what: str, path: Path) -> np.ndarray:
    import torch
    if not isinstance(x, torch.Tensor):
        raise FormatError(f"{path}: field '{what}' must be a tensor, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise FormatError(f"{path}: field '{what}' must hold integers, got {x.dtype}")
    return x.numpy()


def _read(path: Path) -> RecordedLookups:
    if not path.is_file():
        raise FormatError(f"{path}: dlrm_datasets file not found")
    data = _load_tensors(path)
    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise FormatError(f"{path}: expected a tuple (indices, offsets, lengths), got {type(data).__name__}"
                          + (f" of {len(data)}" if isinstance(data, (tuple, list)) else ""))
    indices, offsets, lengths = (_to_numpy(x, name, path) for x, name in zip(data, ("indices", "offsets", "lengths")))
    if indices.ndim != 1 or offsets.ndim != 1:
        raise FormatError(f"{path}: fields 'indices' and 'offsets' must be 1-D, got shapes "
                          f"{list(indices.shape)} and {list(offsets.shape)}")
    if lengths.ndim != 2:
        raise FormatError(f"{path}: field 'lengths' must be [tables, batch], got shape {list(lengths.shape)}")
    num_tables, batch = lengths.shape
    if offsets.size != num_tables * batch + 1:
        raise FormatError(f"{path}: field 'offsets' has {offsets.size} entries; lengths {list(lengths.shape)} "
                          f"needs {num_tables * batch + 1}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != indices.size:
        raise FormatError(f"{path}: field 'offsets' must run from 0 to {indices.size} (len of indices), "
                          f"got {int(offsets[0])}..{int(offsets[-1])}")
    if not np.array_equal(np.diff(offsets), lengths.reshape(-1)):
        raise FormatError(f"{path}: fields 'offsets' and 'lengths' disagree")
    if indices.size and int(indices.min()) < 0:
        raise FormatError(f"{path}: field 'indices' holds negative row ids")
    return RecordedLookups(path, indices, offsets.astype(np.int64), lengths)


def read_recorded(path: str | Path) -> RecordedLookups:
    """Load a dlrm_datasets file (cached per path and modification time)."""
    path = Path(path).resolve()
    try:
        key = (str(path), os.stat(path).st_mtime_ns)
    except OSError:
        raise FormatError(f"{path}: dlrm_datasets file not found") from None
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    log.info("loading %s", path)
    recorded = _read(path)
    _cache[key] = recorded
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return recorded


def load_dlrm(path: str | Path) -> tuple[list[np.ndarray], np.ndarray]:
    """(row ids of each table, lengths ``[T, B]``) of a dlrm_datasets file."""
    recorded = read_recorded(path)
    return [recorded.table_indices(t) for t in range(recorded.num_tables)], recorded.lengths


def recorded_lookups(table: Table) -> tuple[RecordedLookups, int, Path]:
    """(the dlrm_datasets file a table's ``access.indices`` names, read; the table's index in
    it, ``access.table_index``; the file's path), relative paths taken from ``table.base_dir``; FormatError
    naming the table for a file that does not read or an index it does not hold."""
    path = Path(table.access["indices"])
    path = path if path.is_absolute() else (table.base_dir or Path.cwd()) / path
    try:
        recorded = read_recorded(path)
    except FormatError as exc:  # name the tables file and table that point at it
        raise FormatError(f"{table.source or 'table ' + repr(table.name)}: field 'access.indices': {exc}") from None
    t = table.access.get("table_index", 0)
    if not (isinstance(t, int) and 0 <= t < recorded.num_tables):
        raise FormatError(f"table '{table.name}': field 'access.table_index' must be an integer in "
                          f"[0, {recorded.num_tables}) for {path}, got {t!r}")
    return recorded, t, path


def check_recorded_rows(table: Table, rows: np.ndarray, path: Path) -> np.ndarray:
    """``rows`` (row ids of ``table`` recorded in ``path``), refused when one is beyond the table's rows."""
    if rows.size and int(rows.max()) >= table.num_embeddings:
        raise NeuroShardError(f"table '{table.name}': recorded row id {int(rows.max())} in {path} is "
                              f">= num_embeddings {table.num_embeddings}")
    return rows


def recorded_batch(table: Table, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(row ids, lengths) of one batch of a table whose ``access.indices`` names a
    dlrm_datasets file (``recorded_lookups``)."""
    recorded, t, path = recorded_lookups(table)
    rows, lengths = recorded.batch(t, batch_size, rng)
    return check_recorded_rows(table, rows, path), lengths


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def tables_from_dlrm(path: str | Path, name: str | None = None, batch_size: int | None = None,
                     embedding_dim: int = DEFAULT_DIM, relative_to: str | Path | None = None,
                     seed: int = 0) -> TableSet:
    """A TableSet with one table per table of a dlrm_datasets file: rows = max row id + 1
    (at least 100), pooling factor = mean lookups per sample, reuse histogram of one batch
    of ``batch_size`` (default: the recorded batch). ``access.indices`` points back at the
    file, relative to ``relative_to`` (the tables file's folder) when given, else absolute."""
    path = Path(path).resolve()
    recorded = read_recorded(path)
    batch = recorded.batch_size if batch_size is None else int(batch_size)
    if batch < 1:
        raise NeuroShardError(f"{path}: batch size must be >= 1, got {batch}")
    if relative_to is not None:
        base = Path(relative_to).resolve()
        ref = os.path.relpath(path, base)
    else:
        base, ref = None, str(path)
    name = name or path.name.split(".")[0]
    width = len(str(recorded.num_tables - 1))
    tables = []
    for t in range(recorded.num_tables):
        rows = recorded.table_indices(t)
        num_rows = max(int(rows.max()) + 1 if rows.size else 0, MIN_ROWS)
        pooling = rows.size / recorded.batch_size
        sample = recorded.batch(t, batch, np.random.default_rng([seed, t]))[0]
        distinct, _, mean_reuse = acc.reuse_histograms(sample)
        if sample.size == 0:
            distinct[0], mean_reuse = 1.0, 1.0
        access = {"indices": ref, "table_index": t,
                  "reuse_histogram": [_round(x) for x in distinct], "mean_reuse": _round(max(mean_reuse, 1.0))}
        table = Table(f"t{t:0{width}d}", num_rows, embedding_dim, _round(pooling), access)
        table.base_dir = base
        tables.append(table)
    log.info("%s: %d tables, batch %d", path, len(tables), recorded.batch_size)
    return TableSet(name, tables, batch, {"source": {"dlrm_datasets": path.name}})
