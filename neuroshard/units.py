"""Byte sizes with units: ``16GiB``, ``16GB``, ``512MiB``, plain bytes."""
from __future__ import annotations

import math
import re

from .errors import NeuroShardError

#: largest size read (bytes): sizes stay exact in float64
MAX_BYTES = 2**53

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}


def parse_bytes(text: str | int | float) -> int:
    """``"16GiB"`` -> 17179869184. Raises NeuroShardError on anything else."""
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise NeuroShardError(f"cannot read a memory size from {text!r} (use e.g. 16GiB, 16GB or bytes)")
    if isinstance(text, (int, float)):
        number = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if not match or unit not in _UNITS:
            raise NeuroShardError(f"cannot read a memory size from {text!r} (use e.g. 16GiB, 16GB or bytes)")
        number = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(number) or number > MAX_BYTES:
        raise NeuroShardError(f"memory size {text!r} is over the limit of 2**53 bytes (8 PiB)")
    value = int(number)
    if value <= 0:
        raise NeuroShardError(f"memory size must be positive, got {text!r}")
    return value


def format_bytes(num_bytes: float) -> str:
    """17179869184 -> '16.0 GiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
