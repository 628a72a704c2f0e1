"""Safe file writes: atomic replace and durable appends."""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from .errors import FormatError, WriteError, os_reason


def is_special_file(path: str | Path) -> bool:
    """Whether ``path`` (symlinks followed) exists and is not a regular file or a folder: a
    device node (``/dev/null``, ``/dev/stdout``), a FIFO or a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_target(path: str | Path) -> Path:
    """Where a write to ``path`` lands: a symlink's target (written through, as Unix tools
    do; the link stays), else ``path`` itself. A link that never reaches a target (a loop)
    and a name with a trailing slash (a folder's name) are refused, never replaced by a file."""
    given = str(path)
    path = Path(path)
    if given.endswith(os.sep) and not path.is_dir():
        raise WriteError(f"{given}: names a folder (it ends in '{os.sep}'); give a file name")
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath stops where the links go round
        raise WriteError(f"{given}: a loop of symbolic links; give another file name")
    return target


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never half.

    As every Unix tool does, a symlink is written through (its target is replaced, the link
    stays), and a device node or FIFO (``-o /dev/null``, ``-o /dev/stdout``, a named pipe) is
    opened and written, never replaced by a regular file. Only regular files (and new paths)
    are replaced atomically, by a rename from a temporary file beside them. Any ``OSError``
    (no space, a file-size limit, no permission) becomes a ``WriteError`` naming the path."""
    given, path = Path(path), write_target(path)
    existed = path.exists()
    try:
        if is_special_file(path):
            with open(path, "wb") as handle:
                handle.write(data)
        else:
            _replace(path, data)
    except OSError as exc:
        kept = "the old file is intact" if existed else "nothing was written"
        raise WriteError(f"{given}: cannot write it ({os_reason(exc)}); {kept}") from None
    return given


def _replace(path: Path, data: bytes) -> None:
    """Write a temporary file beside ``path``, make it durable, rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def append_jsonl(path: str | Path, record: Any) -> None:
    """Append one JSON record as a line and make it durable before returning; ``WriteError``
    (the file as it was) when it cannot."""
    path = Path(path)
    line = json.dumps(record) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b", buffering=0) as handle:  # unbuffered: a failed write can be cut off
            size = handle.seek(0, os.SEEK_END)
            if size > 0:  # a crash mid-line left a torn record: start on a fresh line
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    line = "\n" + line
            try:
                data = line.encode()
                written = handle.write(data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, "the record was written in part")
                os.fsync(handle.fileno())
            except OSError:
                os.ftruncate(handle.fileno(), size)  # no half record left behind (readers would skip it anyway)
                raise
    except OSError as exc:
        raise WriteError(f"{path}: cannot append a record ({os_reason(exc)}); the records before it are "
                         f"intact") from None


def read_jsonl(path: str | Path) -> list:
    """Records of a JSON-lines file; a torn or unreadable line (crash mid-write) is ignored.
    Records are files this package wrote (a dataset folder's): a device node or FIFO in their
    place is refused, not read without end."""
    path = Path(path)
    if not path.exists():
        return []
    if is_special_file(path):
        raise FormatError(f"{path}: records file is not a regular file")
    records = []
    for raw in path.read_bytes().splitlines():
        raw = raw.strip()
        if not raw:
            continue
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except (ValueError, RecursionError):  # torn line, not UTF-8, or not JSON
            continue
    return records


def repair_jsonl_tail(path: str | Path) -> int:
    """Cut a torn last record (a crash mid-append) off a JSON-lines file so it is strict JSONL
    again; returns the bytes removed. Call it holding the file's writer lock."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        start = max(0, size - (1 << 20))
        handle.seek(start)
        tail = handle.read()
        if tail.endswith(b"\n"):
            return 0
        cut = tail.rfind(b"\n")
        if cut < 0 and start > 0:
            return 0  # a last line longer than 1 MiB: leave it (readers skip it)
        keep = start + cut + 1
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
        return size - keep
