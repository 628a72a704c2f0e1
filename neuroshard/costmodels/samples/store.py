"""The cost-data store: one folder per dataset, append-only JSON lines plus ``meta.json``.

A dataset folder holds

* ``meta.json`` — what it was measured on and how (``hardware``, ``software``,
  ``config``), written when the folder is first used; a later run into the same
  folder with other hardware, software or configuration is refused;
* ``compute.jsonl`` — one line per measured shard set::

    {"sample": i, "batch_size": B, "kernel": "fbgemm_tbe"|"embedding_bag",
     "shards": [Table.to_dict() of each shard + "source_table"],
     "cost_ms": median fwd+bwd, "fwd_ms": median fwd, "times_ms": [...], "cv": x}

* ``comm.jsonl`` — one line per width/skew sample::

    {"sample": i, "num_devices": D, "batch_size": B, "widths": [D], "skews_ms": [D],
     "reduce_width": R, "fwd_ms": [D], "bwd_ms": [D], "reduce_ms": [D], "cv_fwd": x}

Each line is appended and fsync'ed as soon as its measurement ends
(``neuroshard.io.append_jsonl``), so a killed run loses at most the sample it was
measuring; readers ignore a torn last line and keep the first record of a sample.

Under ``torchrun`` each rank writes its own part, ``compute.rank{r}-of{W}.jsonl``
(sample ``i`` belongs to rank ``i % W``), whose first line describes it
(``{"part": {"rank": r, "world_size": W}, "meta": {...}}``, the ``meta.json`` of
that rank). Readers take the main file, then every part (sorted by world size and
rank), keeping the first record of each sample; a part measured differently from
the folder (``meta.json``, else the first part; the hostname aside, so parts may
come from several machines of one kind) is refused. ``merge_parts`` folds the parts
into the main file.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import platform
import re
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from ...errors import FormatError, NeuroShardError
from ...io import append_jsonl, atomic_write_text, read_jsonl
from ...tables import Table
from ...validate import read_json
from ..base import reduce_time_ms
from ..features import shard_set_features
from .kernel import cache_flush_bytes, llc_bytes

COSTDATA_FORMAT = "neuroshard.costdata/v1"
COMPUTE_FILE = "compute.jsonl"
COMM_FILE = "comm.jsonl"
META_FILE = "meta.json"
#: a machine's folder under the cache (``machine_dir``) holds these, written by ``neuroshard pretrain --here``
MACHINE_MODEL_FILE = "model.pt"
MACHINE_OPERATORS_FILE = "operators.json"
MACHINE_REPORT_FILE = "report.txt"


# ------------------------------------------------------------------ hardware
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_generation() -> dict:
    """This CPU's ``cpu family`` and ``model`` numbers (``/proc/cpuinfo``; empty where it has
    none): one model name covers CPUs of different generations ("AMD EPYC": family 25 and
    26, 37% apart in the included runtime's step, docs/decisions.md#calibration-cache)."""
    keys = {"cpu family": "cpu_family", "model": "cpu_model_number"}
    out: dict = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                name = keys.get(key.strip().lower())
                if name and name not in out:
                    out[name] = value.strip()
                if len(out) == len(keys) or not line.strip():
                    break
    except OSError:
        pass
    return out


def other_cpu(hardware: dict) -> str | None:
    """How the CPU of a ``hardware`` record (``hardware_info``'s) differs from this one, in
    words; None when it is the same as far as the record tells (an older record without
    ``cpu_family`` is compared by name only)."""
    here = {"cpu_model": cpu_model(), **cpu_generation()}
    differ = [k for k in ("cpu_model", "cpu_family", "cpu_model_number")
              if hardware.get(k) is not None and here.get(k) is not None and str(hardware[k]) != str(here[k])]
    if not differ:
        return None

    def words(h: dict) -> str:
        generation = ", ".join(f"{k.replace('cpu_', '').replace('_', ' ')} {h[k]}"
                               for k in ("cpu_family", "cpu_model_number") if h.get(k) is not None)
        return f"{h.get('cpu_model', 'unknown')}" + (f" ({generation})" if generation else "")
    return f"measured on {words(hardware)}, this machine is {words(here)}"


def same_cpu(record: dict) -> bool:
    """Whether cost data or a checkpoint with this ``hardware`` record (``{"hardware": {...},
    "config": {...}}``) was measured on a CPU like this one: the same model name and, where
    the record has it, the same cache flush (sized from the last-level cache). Cloud VMs give
    different Xeons one name ("Intel(R) Xeon(R) Processor"): the shipped checkpoint's, with a
    341 MB flush (a 260 MiB cache), was 44-103% off on a VM of that name with a 300 MiB cache
    (on the project's VMs), which the name alone called the same CPU."""
    hardware, config = record.get("hardware") or {}, record.get("config") or {}
    if hardware.get("cpu_model") != cpu_model():
        return False
    flush = config.get("flush_bytes")
    return flush is None or config.get("backend", "cpu") != "cpu" or int(flush) == cache_flush_bytes()


def hardware_info(backend: str) -> dict:
    """Where measurements run: CPU model, core count, GPU (if the backend uses one), host."""
    info = {"cpu_model": cpu_model(), **cpu_generation(), "cpu_count": os.cpu_count(),
            "hostname": platform.node(), "machine": platform.machine(), "gpu": None}
    if backend == "cuda":
        import torch
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
            info["gpu_count"] = torch.cuda.device_count()
    return info


def software_info() -> dict:
    import torch
    try:
        import fbgemm_gpu
        fbgemm = getattr(fbgemm_gpu, "__version__", "unknown")
    except Exception:
        fbgemm = None
    return {"python": platform.python_version(), "torch": torch.__version__, "fbgemm_gpu": fbgemm,
            "numpy": np.__version__, "cuda": getattr(torch.version, "cuda", None)}


# ------------------------------------------------------- machine fingerprint
def cache_root() -> Path:
    """The package's cache: ``$XDG_CACHE_HOME/neuroshard`` (default ``~/.cache/neuroshard``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "neuroshard"


def machine_fingerprint(backend: str = "cpu") -> dict:
    """What a cost measurement of this machine depends on: the CPU (model name, family and
    model numbers, core count, last-level cache size: cloud VMs give different CPUs one name,
    ``same_cpu``), torch's version, whether fbgemm's kernel is installed and, on ``cuda``, the
    GPU's name. The calibration cache and each machine's own models (``machine_dir``) are
    keyed by it. Reads no more than ``/proc`` and sysfs (fbgemm is looked up, not imported)."""
    import torch
    fingerprint = {"cpu_model": cpu_model(), **cpu_generation(), "cpu_count": os.cpu_count(),
                   "llc_bytes": llc_bytes(), "torch": str(torch.__version__),
                   "fbgemm": importlib.util.find_spec("fbgemm_gpu") is not None}
    if backend == "cuda":
        fingerprint["gpu"] = (torch.cuda.get_device_name(torch.cuda.current_device())
                              if torch.cuda.is_available() else None)
    return fingerprint


def fingerprint_id(fingerprint: dict) -> str:
    """A fingerprint as 12 hex digits (the name of its machine's folder)."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]


def describe_fingerprint(fingerprint: dict) -> str:
    """A fingerprint in a few words: "AMD EPYC (family 25, model 17), 2 cores, 32 MiB last-level
    cache, torch 2.5.1, fbgemm"."""
    generation = ", ".join(f"{k.replace('cpu_', '').replace('_number', '').replace('_', ' ')} {fingerprint[k]}"
                           for k in ("cpu_family", "cpu_model_number") if fingerprint.get(k) is not None)
    text = fingerprint.get("cpu_model", "unknown CPU") + (f" ({generation})" if generation else "")
    text += (f", {fingerprint.get('cpu_count')} cores, {int(fingerprint.get('llc_bytes', 0)) >> 20} MiB last-level "
             f"cache, torch {fingerprint.get('torch')}, " + ("fbgemm" if fingerprint.get("fbgemm") else "no fbgemm"))
    if "gpu" in fingerprint:
        text += f", GPU {fingerprint['gpu']}"
    return text


def machine_dir(backend: str = "cpu") -> Path:
    """This machine's folder of its own measurements and models (``neuroshard pretrain --here``):
    ``cache_root()/machines/<fingerprint_id>``, the fingerprint of ``backend``'s measurements."""
    return cache_root() / "machines" / fingerprint_id(machine_fingerprint(backend))


def _backends_here() -> list[str]:
    """The backends whose measurements describe this machine, the GPU's first where torch sees one."""
    import torch
    return ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]


def this_machine_file(name: str) -> Path | None:
    """``name`` (``MACHINE_MODEL_FILE``, ``MACHINE_OPERATORS_FILE``) in this machine's folder: the
    GPU's where torch sees one and that folder has it, else the CPU's; None when neither has it.
    Nothing is fingerprinted when no machine was ever pre-trained here."""
    if not (cache_root() / "machines").is_dir():
        return None
    for backend in _backends_here():
        path = machine_dir(backend) / name
        if path.is_file():
            return path
    return None


def pretrained_here(hardware: dict | None) -> bool:
    """Whether a checkpoint's ``hardware`` record says it was pre-trained on this machine
    (``pretrain --here`` records the fingerprint's id as ``hardware["machine"]["id"]``)."""
    machine = (hardware or {}).get("machine")
    recorded = machine.get("id") if isinstance(machine, dict) else None
    if not recorded:
        return False
    return recorded in {fingerprint_id(machine_fingerprint(backend)) for backend in _backends_here()}


# ---------------------------------------------------------------- meta.json
#: hardware fields parts may differ in: a collection under torchrun may span machines
PART_IGNORED_HARDWARE = ("hostname",)


def read_meta(folder: str | Path) -> dict | None:
    """The folder's ``meta.json``; without one, the description of its first part (a folder
    holding only the parts of a torchrun collection); None when there is neither."""
    meta = _read_meta_file(folder)
    if meta is not None:
        return meta
    for name in (COMPUTE_FILE, COMM_FILE):
        for path in part_files(folder, name):
            header = part_header(path)
            if header is not None:
                return header["meta"]
    return None


def _read_meta_file(folder: str | Path) -> dict | None:
    path = Path(folder) / META_FILE
    if not path.exists():
        return None
    meta = read_json(path, "dataset description")
    if not isinstance(meta, dict):
        raise FormatError(f"{path}: a dataset description must be a JSON object")
    return meta


def write_meta(folder: str | Path, meta: dict) -> None:
    atomic_write_text(Path(folder) / META_FILE, json.dumps(meta, indent=1) + "\n")


def describe(kind: str, hardware: dict, software: dict, config: dict) -> dict:
    """A fresh description of a collection (what ``meta.json`` and a part's first line hold)."""
    return {"format": COSTDATA_FORMAT, "kind": kind, "hardware": hardware, "software": software, "config": config,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def meta_differences(old: dict, new: dict, ignore_hardware: tuple[str, ...] = ()) -> list[str]:
    """``section.key: old -> new`` for each field two descriptions disagree on (``created``
    and the ``ignore_hardware`` fields aside)."""
    diffs = []
    for section in ("kind", "hardware", "software", "config"):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            skip = ignore_hardware if section == "hardware" else ()
            diffs += [f"{section}.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
                      if k not in skip and a.get(k) != b.get(k)]
        elif a != b:
            diffs.append(f"{section}: {a!r} -> {b!r}")
    return diffs


def _diff_text(diffs: list[str]) -> str:
    more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
    return f"{'; '.join(diffs[:3])}{more}"


def check_meta(folder: str | Path, kind: str, hardware: dict, software: dict, config: dict,
               ignore_hardware: tuple[str, ...] = ()) -> tuple[dict, dict | None]:
    """(this run's description, the folder's ``meta.json`` or None): refuse a folder measured
    with other hardware, software or configuration. Writes nothing (``write_meta`` does, once
    a first record is on disk, so a refused run leaves no description behind)."""
    folder = Path(folder)
    meta = describe(kind, hardware, software, config)
    old = _read_meta_file(folder)
    if old is None:
        return meta, None
    if old.get("format") != COSTDATA_FORMAT:
        raise NeuroShardError(f"{folder / META_FILE}: format {old.get('format')!r} is not {COSTDATA_FORMAT!r}")
    diffs = meta_differences(old, meta, ignore_hardware)
    if diffs:
        raise NeuroShardError(f"{folder} holds data measured differently ({_diff_text(diffs)}); use another folder")
    return old, old


# -------------------------------------------------------------------- parts
def part_file(name: str, rank: int, world_size: int) -> str:
    """The file rank ``rank`` of ``world_size`` writes instead of ``name``: compute.rank0-of2.jsonl."""
    return f"{name.removesuffix('.jsonl')}.rank{rank}-of{world_size}.jsonl"


def part_files(folder: str | Path, name: str) -> list[Path]:
    """The parts of ``name`` in ``folder``, sorted by world size, then rank."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = re.compile(re.escape(name.removesuffix(".jsonl")) + r"\.rank(\d+)-of(\d+)\.jsonl")
    found = []
    for path in folder.iterdir():
        m = pattern.fullmatch(path.name)
        if m and int(m.group(1)) < int(m.group(2)):
            found.append(((int(m.group(2)), int(m.group(1))), path))
    return [path for _, path in sorted(found)]


def part_header(path: str | Path) -> dict | None:
    """A part's first line (``{"part": {...}, "meta": {...}}``), or None when it has none yet."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 20)
    except FileNotFoundError:
        return None
    try:
        header = json.loads(first.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if isinstance(header, dict) and isinstance(header.get("part"), dict) and isinstance(header.get("meta"), dict):
        return header
    return None


def write_part_header(path: str | Path, meta: dict, rank: int, world_size: int) -> None:
    """Describe a new part on its first line (durably, before its first record)."""
    append_jsonl(path, {"part": {"rank": rank, "world_size": world_size}, "meta": meta})


def check_parts(folder: str | Path, name: str, meta: dict) -> None:
    """Refuse (one line: ``meta``'s value -> the part's) a part of ``name`` measured differently
    from ``meta`` (the hostname aside), or one holding records without its description line."""
    for path in part_files(folder, name):
        header = part_header(path)
        if header is None:
            if _sampled(path):
                raise FormatError(f"{path}: a part without its description line; move it out of the folder")
            continue
        if header["meta"].get("format") != COSTDATA_FORMAT:
            raise NeuroShardError(f"{path}: format {header['meta'].get('format')!r} is not {COSTDATA_FORMAT!r}")
        diffs = meta_differences(meta, header["meta"], PART_IGNORED_HARDWARE)
        if diffs:
            raise NeuroShardError(f"{path} was measured differently ({_diff_text(diffs)}); move it to another "
                                  f"folder")


def _reference_meta(folder: Path, name: str) -> dict | None:
    """What every part must agree with: ``meta.json``, else the first described part."""
    meta = _read_meta_file(folder)
    if meta is not None:
        return meta
    for path in part_files(folder, name):
        header = part_header(path)
        if header is not None:
            return header["meta"]
    return None


def merge_parts(folder: str | Path, name: str = COMPUTE_FILE) -> tuple[int, int]:
    """Fold the parts of ``name`` into ``folder/name`` (one record per sample, sorted; the
    folder's ``meta.json`` written if missing), then remove the parts; returns (records,
    parts merged). Refuses while any of those files is being written. Crash-safe: the main
    file is replaced atomically before any part is removed, and a part left behind holds
    only samples the main file already has (readers keep the first)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NeuroShardError(f"{folder}: no such cost-data folder")
    parts = part_files(folder, name)
    if not parts:
        return len(_records(folder, name)), 0
    with ExitStack() as stack:
        for file in (name, *(p.name for p in parts)):
            stack.enter_context(locked(folder, file))
        records = _records(folder, name)
        meta = _reference_meta(folder, name)
        atomic_write_text(folder / name, "".join(json.dumps(r) + "\n" for r in records))
        if meta is not None and _read_meta_file(folder) is None:
            write_meta(folder, meta)
        for path in parts:
            path.unlink()
    return len(records), len(parts)


@contextmanager
def locked(folder: str | Path, name: str) -> Iterator[None]:
    """Only one writer per dataset file ``folder/name`` (an advisory lock on the file itself,
    so no stray lock file; released by the OS even after kill -9)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NeuroShardError(f"{folder}: is a file, not a cost-data folder")
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / name, "a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise NeuroShardError(f"{folder}: another collection is writing this folder") from None
        yield
    finally:
        handle.close()


# ------------------------------------------------------------------ records
def _records(folder: str | Path, name: str) -> list[dict]:
    """The records of ``name`` and of its parts, one per sample (the first found: the main
    file, then the parts in order), sorted by sample; a part measured differently is refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NeuroShardError(f"{folder}: no such cost-data folder")
    parts = part_files(folder, name)
    reference = _reference_meta(folder, name) if parts else None
    if reference is not None:
        check_parts(folder, name, reference)
    seen, out = set(), []
    for path in (folder / name, *parts):
        for record in _sampled(path):
            if record["sample"] in seen:
                continue
            seen.add(record["sample"])
            out.append(record)
    out.sort(key=lambda r: r["sample"])
    return out


def _sampled(path: Path) -> list[dict]:
    """The records of ``path`` that carry a sample number (an integer >= 0); FormatError
    naming the file for a record whose sample number is not one."""
    out = []
    for record in read_jsonl(path):
        if not isinstance(record, dict) or "sample" not in record:
            continue
        sample = record["sample"]
        if not (isinstance(sample, int) and not isinstance(sample, bool) and sample >= 0):
            raise FormatError(f"{path}: a record's field 'sample' must be an integer >= 0, got {sample!r}")
        out.append(record)
    return out


def done_samples(folder: str | Path, name: str) -> set[int]:
    """The samples on disk in ``name`` or any of its parts."""
    folder = Path(folder)
    return {r["sample"] for path in (folder / name, *part_files(folder, name)) for r in _sampled(path)}


def load_compute_data(folder: str | Path) -> list[dict]:
    """Records of ``compute.jsonl`` and its parts (one per shard set, sorted by sample, no
    duplicates)."""
    return _records(folder, COMPUTE_FILE)


def load_comm_data(folder: str | Path) -> list[dict]:
    """Records of ``comm.jsonl`` (one per sample, sorted by sample, no duplicates)."""
    return _records(folder, COMM_FILE)


def record_shards(record: dict) -> list[Table]:
    """The shards of a compute record as ``Table`` objects (``source_table`` kept in ``extra``)."""
    return [Table.from_dict(s, where=f"sample {record.get('sample')}") for s in record["shards"]]


def compute_arrays(records: list[dict]) -> tuple[list[np.ndarray], np.ndarray]:
    """(feature array per shard set, cost_ms per set): the inputs of ``ComputeCostModel.fit``."""
    sets = [shard_set_features(record_shards(r), int(r["batch_size"])) for r in records]
    return sets, np.asarray([r["cost_ms"] for r in records], dtype=np.float64)


def comm_arrays(records: list[dict]) -> dict[str, np.ndarray]:
    """Arrays for ``CommCostModel.fit`` from records of one device count: widths, skews_ms,
    fwd_ms, bwd_ms, reduce_ms_per_device of shape (P, D); reduce_width and reduce_ms
    (``base.reduce_time_ms``: the mean over devices, as the models fit) of shape (P,)."""
    counts = {r["num_devices"] for r in records}
    if len(counts) > 1:
        raise NeuroShardError(f"comm records mix device counts {sorted(counts)}; pass one count at a time")
    get = lambda key: np.asarray([r[key] for r in records], dtype=np.float64)  # noqa: E731
    per_device = get("reduce_ms")
    return {"widths": get("widths"), "skews_ms": get("skews_ms"), "fwd_ms": get("fwd_ms"), "bwd_ms": get("bwd_ms"),
            "reduce_width": get("reduce_width"), "reduce_ms_per_device": per_device,
            "reduce_ms": reduce_time_ms(per_device) if per_device.size else per_device}
