"""Byte sizes with units: ``16GiB``, ``16GB``, ``512MiB``, ``512B``, and plain bytes from ``MIN_BARE_BYTES`` up."""
from __future__ import annotations

import math
import re

from .errors import NeuroShardError

#: largest size read (bytes): sizes stay exact in float64
MAX_BYTES = 2**53

#: smallest size read as bytes from text without a unit: below it (``-m 16``, ``memory="512"``,
#: ``"device_memory_bytes": "16"``) the text is refused as a forgotten unit, never read as a few
#: bytes. A number (a Python int, a JSON number) is bytes as given: its field names bytes.
MIN_BARE_BYTES = 4096

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
#: one-letter units, read by some tools as binary and by others as decimal: refused with both spellings
_AMBIGUOUS = ("k", "m", "g", "t")

_HOW = "use e.g. 16GiB (binary), 16GB (decimal) or 512B (bytes)"


def parse_bytes(text: str | int | float) -> int:
    """``"16GiB"`` -> 17179869184. Text without a unit is bytes from ``MIN_BARE_BYTES`` up, a number is bytes;
    ``K``/``M``/``G``/``T`` alone are refused (binary or decimal?). Raises NeuroShardError on
    anything else."""
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise NeuroShardError(f"cannot read a memory size from {text!r} ({_HOW})")
    unit = ""
    if isinstance(text, (int, float)):
        number = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text, flags=re.ASCII)
        unit = match.group(2).lower() if match else ""
        if match and unit in _AMBIGUOUS:
            value = match.group(1)
            raise NeuroShardError(f"memory size {text!r} is ambiguous: write {value}{unit.upper()}iB "
                                  f"({format_count(float(value) * 1024 ** (_AMBIGUOUS.index(unit) + 1))} bytes) or "
                                  f"{value}{unit.upper()}B ({format_count(float(value) * 1000 ** (_AMBIGUOUS.index(unit) + 1))} bytes)")
        if not match or (unit and unit not in _UNITS):
            raise NeuroShardError(f"cannot read a memory size from {text!r} ({_HOW})")
        number = float(match.group(1)) * _UNITS.get(unit, 1)
    if not math.isfinite(number) or number > MAX_BYTES:
        raise NeuroShardError(f"memory size {text!r} is over the limit of 2**53 bytes (8 PiB)")
    value = int(number)
    if value <= 0:
        raise NeuroShardError(f"memory size must be positive, got {text!r}")
    if isinstance(text, str) and not unit and value < MIN_BARE_BYTES:
        raise NeuroShardError(f"memory size {text!r} has no unit: write e.g. {text}GiB or {text}GB, or {text}B "
                              f"if you mean {value} bytes (a number without a unit is bytes from "
                              f"{MIN_BARE_BYTES} up)")
    return value


def format_count(value: float) -> str:
    """17179869184 -> '17,179,869,184'."""
    return f"{int(value):,}"


def format_bytes(num_bytes: float) -> str:
    """17179869184 -> '16.0 GiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
