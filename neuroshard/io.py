"""Safe file writes: atomic replace and durable appends."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never half."""
    path = Path(path)
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
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def append_jsonl(path: str | Path, record: Any) -> None:
    """Append one JSON record as a line and make it durable before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record) + "\n"
    with open(path, "a+b") as handle:
        if handle.tell() > 0:  # a crash mid-line left a torn record: start on a fresh line
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                line = "\n" + line
        handle.write(line.encode())
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: str | Path) -> list:
    """Records of a JSON-lines file; a torn or unreadable line (crash mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
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
