"""Measure a plan: run training iterations and report, per device, the quantities the
cost models predict (embedding compute, forward and backward communication, their
total) as medians over the iterations after warm-up, and their max over devices.

Compute runs the fused kernel the cost data was measured with and is timed on the
same clock (thread CPU time on CPU), so a plan's measured and predicted costs
compare; ``compute_wall_ms`` is its wall-clock figure."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..plan import Plan
from ..tables import TableSet
from .trainer import PHASES, RunConfig, RunResult, check_run, run

DEFAULT_WARMUP = 3


@dataclass
class Measurement:
    """Per-device medians (ms) of one measured run of a plan."""

    plan: Plan
    per_device: list[dict]
    iterations: int  # measured, after warm-up
    warmup: int
    batch_size: int
    backend: str
    kernel: str = ""
    clock: str = ""

    @property
    def per_device_cost_ms(self) -> list[float]:
        return [d["total_ms"] for d in self.per_device]

    @property
    def max_device_cost_ms(self) -> float:
        return max(self.per_device_cost_ms)

    @property
    def iterations_per_s(self) -> float:
        """Training iterations per second (the slowest device's median step)."""
        return 1e3 / max(d["step_ms"] for d in self.per_device)

    def table(self):
        """One row per device plus a 'max' row (pandas DataFrame, milliseconds)."""
        import pandas as pd
        df = pd.DataFrame(self.per_device)
        top = {"device": "max", "shards": int(df["shards"].max())}
        top.update({c: float(df[c].max()) for c in df.columns if c.endswith("_ms")})
        return pd.concat([df, pd.DataFrame([top])], ignore_index=True)

    def format(self) -> str:
        """The table as text, with a header and the plan's estimate beside it when it has one."""
        head = (f"measured plan for '{self.plan.tables_name}' on {len(self.per_device)} devices ({self.backend}, "
                f"kernel {self.kernel}, compute on the {self.clock} clock): batch {self.batch_size}, median of {self.iterations} iterations "
                f"after {self.warmup} warm-up; {self.iterations_per_s:.2f} iterations/s")
        est = (self.plan.estimate or {}).get("max_device_cost_ms")
        tail = f"\nmax device cost: {self.max_device_cost_ms:.3f} ms measured"
        if est is not None:
            tail += f", {float(est):.3f} ms estimated by the plan"
        return head + "\n" + self.table().round(3).to_string(index=False) + tail

    def to_dict(self) -> dict:
        return {"tables_name": self.plan.tables_name, "num_devices": len(self.per_device),
                "backend": self.backend, "kernel": self.kernel, "clock": self.clock, "batch_size": self.batch_size, "iterations": self.iterations,
                "warmup": self.warmup, "max_device_cost_ms": self.max_device_cost_ms,
                "per_device_cost_ms": self.per_device_cost_ms, "iterations_per_s": self.iterations_per_s,
                "per_device": self.per_device, "estimate": self.plan.estimate}

    def write_json(self, path: str | Path) -> Path:
        from ..io import atomic_write_text
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")


def summarize(plan: Plan, result: RunResult, warmup: int, batch_size: int) -> Measurement:
    """Medians per device over the steps after ``warmup`` (each device's total is the
    median of its per-step totals, not the sum of medians)."""
    per_device = []
    for rank, records in enumerate(result.records):
        kept = records[warmup:] or records
        row: dict = {"device": rank, "shards": len(plan.shards_on(rank))}
        for phase in PHASES:
            row[phase] = statistics.median(r[phase] for r in kept)
        row["total_ms"] = statistics.median(sum(r[p] for p in PHASES) for r in kept)
        row["compute_wall_ms"] = statistics.median(r["compute_wall_ms"] for r in kept)
        row["dense_ms"] = statistics.median(r["dense_ms"] for r in kept)
        row["step_ms"] = statistics.median(r["step_ms"] for r in kept)
        per_device.append(row)
    steps = len(result.records[0])
    used_warmup = warmup if steps > warmup else 0
    return Measurement(plan, per_device, steps - used_warmup, used_warmup, batch_size, result.backend,
                       result.kernel, result.clock)


def evaluate(plan: Plan, tables: TableSet, devices: int | None = None, iterations: int = 20,
             warmup: int = DEFAULT_WARMUP, batch_size: int | None = None, **options) -> Measurement | None:
    """Run ``iterations`` training steps of ``plan`` and measure every device (None on
    ranks other than 0 under torchrun). ``options`` go to ``RunConfig`` (lr, seed,
    row_cap, backend, kernel, timeout_s, fault)."""
    devices = devices or plan.num_devices
    check_run(plan, tables, devices)
    batch_size = batch_size or tables.batch_size
    config = RunConfig(plan, list(tables), devices, steps=iterations + warmup, batch_size=batch_size, **options)
    result = run(config)
    if result is None:
        return None
    return summarize(plan, result, warmup, batch_size)
