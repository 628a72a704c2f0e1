"""Weights precision in the estimate: the precision a compute model was measured at, and
the measured ratio that carries an fp32 model's compute to fp16 weights.

A compute model predicts the kernel it was measured with (``collect compute`` or
``calibrate`` with ``--weights-precision``; fp32 unless its data says otherwise). A plan
whose weights have another trainable precision gets that model's compute times the
ratio of the two precisions' kernel times, measured on this project's machine by
``experiments/precision_ratio.py`` (fp32 and fp16 timed in turn on the same shard sets,
one interleaved run) and stored with the command in ``checkpoints/precision_scaling.json``.
Calibrating at the plan's precision replaces the ratio by measurements of the user's
own machine and tables.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCALING_FILE = Path(__file__).resolve().parent.parent / "checkpoints" / "precision_scaling.json"


def model_precision(models: Any) -> str:
    """The weights precision a bundle's compute model was measured at (``fp32`` unless its
    hardware record says otherwise: calibration sets ``weights_precision``, pre-training
    keeps the data's ``config``)."""
    hardware = getattr(models, "hardware", None) or {}
    return hardware.get("weights_precision") or (hardware.get("config") or {}).get("weights_precision") or "fp32"


def measured_ratios() -> dict[str, dict]:
    """Per precision, its measured kernel time over fp32's (``compute_ratio_to_fp32``) and how
    it was measured; fp32 itself is 1."""
    ratios = {"fp32": {"compute_ratio_to_fp32": 1.0}}
    if SCALING_FILE.exists():
        ratios.update(json.loads(SCALING_FILE.read_text()))
    return ratios


def compute_scaling(models: Any, weights_precision: str) -> tuple[float, str, dict]:
    """(factor on the model's compute, the precision the estimate is then for, what the
    plan's provenance records). Without a measured ratio between the model's precision
    and ``weights_precision`` (int8, or 8-byte weights) the estimate stays at the model's."""
    measured = model_precision(models)
    if weights_precision == measured:
        return 1.0, measured, {}
    ratios = measured_ratios()
    if weights_precision not in ratios or measured not in ratios:
        return 1.0, measured, {}
    factor = ratios[weights_precision]["compute_ratio_to_fp32"] / ratios[measured]["compute_ratio_to_fp32"]
    source = ratios[weights_precision if weights_precision != "fp32" else measured]
    record = {"from": measured, "compute_factor": round(factor, 4),
              "measured_by": source.get("command", ""), "measured_on": source.get("machine", "")}
    return factor, weights_precision, {"cost_precision_scaling": record}
