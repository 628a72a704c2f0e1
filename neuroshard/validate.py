"""One input-validation layer for files and options, shared by the CLI and the API.

* ``read_json``: the one JSON-file reader (tables files, plans, dataset
  descriptions). A file that is missing, a folder, not UTF-8 (UTF-16 included),
  not JSON, or nested too deeply becomes a one-line ``FormatError`` naming it.
* Limits: every numeric field and option has an upper bound, so sizes stay exact
  (below 2**53 bytes, the float64 range the search computes in) and no input can
  make a run allocate or search without end. Errors quote the limit by name.
* ``check_*`` functions for library arguments (``devices=True`` is not a device
  count), and argparse ``type=`` helpers built on them for every CLI option.
* ``check_output``: an output path is checked before the work starts (not a
  folder, its parent writable, not one of the inputs).
* ``check_format``: a file's ``format`` field; another of neuroshard's files (a tables
  file where a plan is read) is named as what it is (``FILE_KINDS``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .constants import COMM_PRECISIONS, ROW_BLOCKS, UNTRAINABLE_PRECISIONS, WEIGHTS_PRECISIONS
from .errors import FormatError, NeuroShardError, WriteError
from .io import is_special_file, write_target
from .units import parse_bytes

# ------------------------------------------------------------------- limits
#: most tables in one tables file (production models have thousands; time and memory per size: docs/results.md)
MAX_TABLES = 100_000
#: most devices of a plan or a search
MAX_DEVICES = 16_384
#: most rows of one table (with MAX_EMBEDDING_DIM and MAX_BYTES_PER_ELEMENT: sizes < 2**53 bytes)
MAX_NUM_EMBEDDINGS = 2**36
#: widest table
MAX_EMBEDDING_DIM = 2**14
#: largest pooling factor (lookups per sample) of a table
MAX_POOLING_FACTOR = 1000.0
#: most bytes per weight counted in memory
MAX_BYTES_PER_ELEMENT = 8
#: largest batch size
MAX_BATCH_SIZE = 2**20
#: most lookups of one table in one batch (batch size x pooling factor): one sampled batch stays < 1 GiB
MAX_LOOKUPS_PER_BATCH = 2**27
#: largest memory size (bytes) of a device
MAX_MEMORY_BYTES = 2**53
#: largest seed
MAX_SEED = 2**32 - 1
#: most steps, iterations or samples asked of one run
MAX_STEPS = 10**7
#: largest JSON file read (bytes)
MAX_JSON_BYTES = 2**31
#: a bounded read's step (``read_bounded``)
READ_CHUNK_BYTES = 2**24
#: a run of NUL bytes no text has (UTF-16 and UTF-32 text has single and triple NULs: their
#: encodings are refused by name later): ``/dev/zero`` and binary files stop at the first chunk
NULS = b"\0" * 8

LIMITS = {name: value for name, value in globals().items() if name.startswith("MAX_")}


# -------------------------------------------------------------------- files
def decode_text(raw: bytes, path: str | Path, what: str = "file") -> str:
    """``raw`` as UTF-8 text (a UTF-8 byte-order mark is allowed); FormatError naming ``path`` otherwise."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(raw) >= 2 and (raw[0] == 0) != (raw[1] == 0)):
        raise FormatError(f"{path}: {what} is UTF-16 encoded; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: {what} is not UTF-8 text (invalid byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start}); save it as UTF-8") from None


def parse_json(text: str, source: str | Path, what: str = "file") -> Any:
    """``json.loads`` with every failure (syntax, nesting depth, huge numbers) as one FormatError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{source}: {what} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                          f"{exc.msg})") from None
    except RecursionError:
        raise FormatError(f"{source}: {what} is not valid JSON for neuroshard (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise FormatError(f"{source}: {what} is not valid JSON for neuroshard ({str(exc).splitlines()[0]})") from None


def read_bounded(path: str | Path, limit: int, what: str = "file", text: bool = True) -> bytes:
    """At most ``limit`` bytes of ``path``, whatever it is (a device such as ``/dev/zero`` or
    a pipe reports size 0 and may never end): FormatError naming it when there is more, or,
    for a ``text`` file, at the first run of NUL bytes (``NULS``: ``/dev/zero`` stops at once)."""
    out = bytearray()
    with open(path, "rb") as handle:
        while len(out) <= limit:
            chunk = handle.read(min(READ_CHUNK_BYTES, limit + 1 - len(out)))
            if not chunk:
                break
            if text and NULS in chunk:
                raise FormatError(f"{path}: {what} is not a text file (it has runs of NUL bytes)")
            out += chunk
    if len(out) > limit:
        raise FormatError(f"{path}: {what} is over {limit:,} bytes, the most neuroshard reads for it")
    return bytes(out)


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of ``path``; FormatError (naming it) when missing, a folder, too large or not UTF-8."""
    path = Path(path)
    try:
        if path.is_dir():
            raise FormatError(f"{path}: is a folder, not a {what}")
        raw = read_bounded(path, MAX_JSON_BYTES, what)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    return decode_text(raw, path, what)


def read_json(path: str | Path, what: str = "file") -> Any:
    """The JSON value in ``path``; one-line FormatError naming the file for anything unreadable."""
    return parse_json(read_text(path, what), path, what)


#: neuroshard's JSON files by the family of their ``format`` (the part before ``/v``): what a
#: person calls one, and where one comes from; a file of one kind given where another is read
#: is named as what it is (``check_format``)
FILE_KINDS = {
    "neuroshard.tables": ("tables file", "neuroshard tables generate writes one; docs/formats.md describes it"),
    "neuroshard.plan": ("plan", "neuroshard search writes one"),
    "neuroshard.topology": ("topology file", "docs/formats.md describes it"),
    "neuroshard.model": ("model file", "docs/formats.md describes it"),
    "neuroshard.torchrec-sharding": ("TorchRec sharding export", "neuroshard export --format torchrec writes one"),
    "neuroshard.operator-costs": ("operator-costs file", "neuroshard collect dense writes one"),
    "neuroshard.costdata": ("cost data file", "neuroshard collect writes one"),
}


def _format_family(value: Any) -> str | None:
    return value.split("/v")[0] if isinstance(value, str) else None


def check_format(data: Mapping, expected: str, source: str | Path, optional: bool = False) -> None:
    """Nothing when ``data``'s ``format`` field is ``expected`` (or absent, when ``optional``);
    else a one-line FormatError: another kind of neuroshard file is named as what it is
    ("this is a tables file (neuroshard.tables/v1), not a plan: give a plan file (neuroshard
    search writes one)"), anything else quotes the format this version reads."""
    if "format" not in data:
        if optional:
            return
        raise FormatError(f"{source}: field 'format' is missing; this version of neuroshard reads {expected!r}")
    found = data["format"]
    if found == expected:
        return
    want, have = FILE_KINDS.get(_format_family(expected)), FILE_KINDS.get(_format_family(found))
    if want is not None and have is not None and _format_family(found) != _format_family(expected):
        noun = want[0]
        file = noun if noun.endswith("file") else f"{noun} file"
        raise FormatError(f"{source}: this is a {have[0]} ({found}), not a {noun}: give a {file} ({want[1]})")
    raise FormatError(f"{source}: field 'format' is {found!r}; this version of neuroshard reads {expected!r}")


def has_control_character(text: str) -> bool:
    """Whether ``text`` holds a control character (a newline, a tab, NUL, ESC, DEL, C1 codes)."""
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


def check_name(value: Any, where: str, field: str = "name", empty: bool = False) -> str:
    """A name that goes into every output (tables, plans, TorchRec exports, terminal tables):
    a string, non-empty unless ``empty``, without control characters; FormatError naming
    ``where`` and ``field`` otherwise."""
    if not isinstance(value, str) or (not value and not empty):
        raise FormatError(f"{where}: field '{field}' must be a non-empty string, got {value!r}")
    if has_control_character(value):
        raise FormatError(f"{where}: field '{field}' {value!r} has a control character (a newline, tab, NUL, ...); "
                          f"names must be printable")
    return value


# ---------------------------------------------------------------- arguments
def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON's ``true`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(value: Any, name: str, low: int = 0, high: int | None = None) -> int:
    """``value`` as an int in [low, high]; NeuroShardError naming ``name`` otherwise (bools refused)."""
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"
        raise NeuroShardError(f"{name} must be {bound}, got {value!r}")
    return int(value)


def check_number(value: Any, name: str, low: float | None = None, high: float | None = None,
                 low_open: bool = False) -> float:
    """A finite number in [low, high] (``(low, high]`` with ``low_open``); bools and strings refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        lo = "" if low is None else (f"> {low:g}" if low_open else f">= {low:g}")
        hi = "" if high is None else f"<= {high:g}"
        bound = " and ".join(x for x in (lo, hi) if x)
        raise NeuroShardError(f"{name} must be a finite number{' ' + bound if bound else ''}, got {value!r}")
    return float(value)


def check_devices(value: Any, name: str = "devices") -> int:
    return check_int(value, name, 1, MAX_DEVICES)


def check_seed(value: Any, name: str = "seed") -> int:
    return check_int(value, name, 0, MAX_SEED)


def check_bytes_per_element(value: Any, name: str = "bytes_per_element") -> int:
    return check_int(value, name, 1, MAX_BYTES_PER_ELEMENT)


def check_comm_precision(value: Any, name: str = "comm_precision") -> str:
    if value not in COMM_PRECISIONS:
        raise NeuroShardError(f"{name} must be one of {', '.join(COMM_PRECISIONS)}, got {value!r}")
    return value


def check_weights_precision(precision: str) -> str:
    """``precision`` if a kernel trains with it; NeuroShardError saying why not otherwise."""
    if precision in UNTRAINABLE_PRECISIONS:
        raise NeuroShardError(f"weights precision {precision} cannot be trained here: fbgemm-gpu-cpu has no CPU "
                              f"backward for {precision} weights; it counts in memory only (bytes per element "
                              f"{UNTRAINABLE_PRECISIONS[precision]}), costed as fp32")
    if precision not in WEIGHTS_PRECISIONS:
        raise NeuroShardError(f"unknown weights precision {precision!r}; choose one of "
                              f"{', '.join(WEIGHTS_PRECISIONS)}")
    return precision


def check_row_blocks(value: Any, name: str = "row_blocks") -> str:
    """Which row splits a search may make (``constants.ROW_BLOCKS``)."""
    if value not in ROW_BLOCKS:
        raise NeuroShardError(f"{name} must be one of {', '.join(ROW_BLOCKS)}, got {value!r}"[:200])
    return value


def check_batch_size(value: Any, name: str = "batch_size") -> int:
    return check_int(value, name, 1, MAX_BATCH_SIZE)


def check_memory(value: Any, name: str = "memory") -> int:
    """A device memory size: bytes (int) or a size like ``"16GiB"``, in [1, MAX_MEMORY_BYTES]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise NeuroShardError(f"{name} must be a size in bytes or like '16GiB', got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise NeuroShardError(f"{name} must be a finite size, got {value!r}")
    size = parse_bytes(value)
    if size > MAX_MEMORY_BYTES:
        raise NeuroShardError(f"{name} {value!r} is over MAX_MEMORY_BYTES (2**53 bytes = 8 PiB)")
    return size


# ------------------------------------------------------- argparse type= helpers
def _arg(check: Callable[[Any], Any], parse: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse ``type=``: parse the text, check it, turn NeuroShardError into argparse's one line."""
    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            return check(value)
        except NeuroShardError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("value must", "must")) from None
    convert.__name__ = what  # argparse names the type in its messages
    return convert


def optional_count(convert: Callable[[str], Any], option: str) -> Callable[[str], Any]:
    """``convert`` for an option whose count may be left out (``nargs="?"``): argparse gives
    it the next word, so ``search --calibrate tables.json`` reads the file name as the count;
    the error then says how to write it."""
    def wrapped(text: str) -> Any:
        try:
            return convert(text)
        except argparse.ArgumentTypeError as exc:
            if text.strip().lstrip("+-").isdigit():
                raise
            raise argparse.ArgumentTypeError(f"{exc}: to use the default count, give {text!r} before {option} "
                                             f"(or write {option} N {text})") from None
    wrapped.__name__ = convert.__name__
    return wrapped


def _ascii_number(text: str) -> str:
    """``text`` stripped, refused (``ValueError``) unless written in ASCII: Python reads
    full-width and other Unicode digits (``３``) as numbers, the size and unit parsers do not,
    and every option should read a number the same way."""
    text = text.strip()
    if not text.isascii():
        raise ValueError(text)
    return text


def _int(text: str) -> int:
    return int(_ascii_number(text))


def _float(text: str) -> float:
    return float(_ascii_number(text))


def int_in(low: int, high: int | None = None, what: str | None = None) -> Callable[[str], int]:
    return _arg(lambda v: check_int(v, "value", low, high), _int, what or "an integer")


def float_in(low: float | None = None, high: float | None = None, low_open: bool = False,
             what: str | None = None) -> Callable[[str], float]:
    return _arg(lambda v: check_number(v, "value", low, high, low_open), _float, what or "a number")


positive_int = int_in(1, MAX_STEPS, "a positive integer")
nonneg_int = int_in(0, MAX_STEPS, "an integer >= 0")
device_count = int_in(1, MAX_DEVICES, "a device count")
seed_int = int_in(0, MAX_SEED, "a seed")
batch_size_int = int_in(1, MAX_BATCH_SIZE, "a batch size")
bytes_per_element_int = int_in(1, MAX_BYTES_PER_ELEMENT, "bytes per element")
positive_float = float_in(0.0, None, low_open=True, what="a positive number")
nonneg_float = float_in(0.0, None, what="a number >= 0")
probability = float_in(0.0, 1.0, what="a probability")


def memory_size(text: str) -> int:
    """argparse ``type=`` for a memory size (``16GiB``, ``16GB``, bytes)."""
    try:
        return check_memory(text)
    except NeuroShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


memory_size.__name__ = "a memory size"


# ------------------------------------------------------------------ outputs
def check_output(path: str | Path, inputs: Iterable[str | Path | None] = (), what: str = "output file") -> Path:
    """Refuse an output path before any work: a folder, a parent that is not a writable
    folder, or the same file as one of ``inputs``."""
    given = str(path)
    path = Path(path)
    if given == "" or path.is_dir():
        raise NeuroShardError(f"{path}: {what} is a folder; give a file name")
    try:
        target = write_target(given)  # a symlink is written through; a loop or a folder's name refused
    except WriteError as exc:
        raise NeuroShardError(str(exc)) from None
    for other in inputs:
        if other is None:
            continue
        other = Path(other)
        if os.path.realpath(path) == os.path.realpath(other) or (path.exists() and other.exists() and
                                                                 os.path.samefile(path, other)):
            raise NeuroShardError(f"{path}: {what} is also an input; write to another file")
    if is_special_file(path):  # a device node or FIFO is written into (atomic_write_bytes), not replaced
        if not os.access(path, os.W_OK):
            raise NeuroShardError(f"{path}: cannot write {what}: no permission to write it")
        return path
    existing = _deepest_existing(target.parent if str(target.parent) else Path("."))
    if not existing.is_dir():
        raise NeuroShardError(f"{path}: cannot write {what}: {existing} is not a folder")
    if target.exists() and not os.access(target, os.W_OK):
        raise NeuroShardError(f"{path}: cannot write {what}: the file is read-only")
    if not _writable(existing):
        raise NeuroShardError(f"{path}: cannot write {what} in {existing} (the folder is not writable)")
    return path


def _deepest_existing(path: Path) -> Path:
    """``path`` or its deepest ancestor that exists (missing folders are created on write)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (tried for real: ``os.access`` says yes to root
    on read-only file systems)."""
    import tempfile
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_output_folder(path: str | Path, what: str = "output folder") -> Path:
    """Refuse an output folder before any work: an existing file, or a parent that is not writable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NeuroShardError(f"{path}: {what} is an existing file, not a folder")
    existing = _deepest_existing(path)
    if not existing.is_dir():
        raise NeuroShardError(f"{path}: cannot create {what}: {existing} is not a folder")
    if not _writable(existing):
        raise NeuroShardError(f"{path}: cannot create {what} in {existing} (not writable)")
    return path
