"""The embedding memory a rank holds, measured, beside what the plan counts for it.

A plan counts per device the weights, the optimizer state, the device caches of cached
shards and their bookkeeping (``Plan.memory_used_bytes``), and per host the backing stores
of cached shards (``Plan.backing_used_bytes``). The runtime is held to it here: every
tensor (and numpy array) the rank's embeddings keep between steps is found by walking the
objects that hold them (the fused kernel, fbgemm's modules and their optimizer state, the
caches and their slot maps, the replicas), and their storages summed once each
(``untyped_storage().nbytes()``: what was allocated, padding included). On CPU the
process's peak RSS is far coarser (the dense model, the batches, the libraries): it is
reported apart, as is CUDA's allocator peak (``torch.cuda.max_memory_allocated``) on a GPU.

What a step allocates and frees again (activations, gradients, the exchange's buffers) is
not embedding storage and is not counted: the plan does not count it either. The storage
only grows during a run, so measured after the last step it is the run's peak. Two parts
are held that the plan's count leaves out, each reported: a cache's slots beyond its
capacity (``excess_slot_bytes``: a batch with more unique rows than the cache holds takes
slots for the rest and keeps them; fbgemm reads such rows over the host link instead) and
the table-batched kernel's own offsets and counters (a few hundred bytes per kernel,
``KERNEL_METADATA_BYTES``). On the host side, the runtime's cache keeps an index over all
of a shard's rows (``cache_index_bytes``: each row's slot and LRU order) that fbgemm's
set-associative cache does not have.
"""
from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from ..plan import Plan
from ..units import format_bytes

#: the packages whose objects are walked for the tensors they hold (others are not looked into)
WALKED_PACKAGES = ("neuroshard", "fbgemm_gpu", "torch")


def held_arrays(objects: Iterable[Any]) -> Iterator[torch.Tensor | np.ndarray]:
    """Every tensor and numpy array reachable from ``objects`` through containers, optimizers
    and the attributes of objects of ``WALKED_PACKAGES`` (each object once); of a module, its
    parameters and buffers (its state: fbgemm's kernels also keep the last batch's indices as
    plain attributes, which are the batch's, not the tables')."""
    seen: set[int] = set()
    stack = list(objects)
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            yield obj
        elif isinstance(obj, torch.nn.Module):
            stack.extend(obj.parameters())
            stack.extend(obj.buffers())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif type(obj).__module__.split(".")[0] in WALKED_PACKAGES and hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())


def storage_bytes(objects: Iterable[Any]) -> int:
    """Bytes of the distinct storages of the tensors and arrays ``objects`` hold (a view and
    its base count once; a memory-mapped array counts its file's bytes)."""
    total, counted = 0, set()
    for a in held_arrays(objects):
        if isinstance(a, torch.Tensor):
            if a.is_meta or a.layout != torch.strided:
                continue
            storage = a.untyped_storage()
            key = ("torch", a.device.type, a.device.index, storage.data_ptr(), storage.nbytes())
            size = storage.nbytes()
        else:
            base = a
            while isinstance(base.base, np.ndarray):
                base = base.base
            key = ("numpy", base.__array_interface__["data"][0], base.nbytes)
            size = base.nbytes
        if size and key not in counted:
            counted.add(key)
            total += size
    return total


def process_peak(device: torch.device) -> tuple[int, str]:
    """(bytes, what): CUDA's allocator peak on a GPU, else the process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "CUDA allocator peak"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return int(peak if sys.platform == "darwin" else peak * 1024), "process peak RSS"


#: bytes a table-batched kernel keeps besides its rows, which plans do not count: fbgemm's
#: offsets, sizes and counters (456 bytes for a TBE of 4 tables on fbgemm-gpu-cpu 1.8)
KERNEL_METADATA_BYTES = 1024


@dataclass
class HeldMemory:
    """The embedding storage a rank's plan holds: ``device_bytes`` (weights, optimizer state,
    device caches and their slot maps, replicas, kernels' metadata), of which
    ``excess_slot_bytes`` are cache slots beyond the caches' capacity; ``backing_bytes``, the
    cached shards' backing stores by tier; ``cache_index_bytes``, the caches' index over all
    rows (host memory)."""

    device_bytes: int = 0
    excess_slot_bytes: int = 0
    backing_bytes: dict[str, int] = field(default_factory=dict)
    cache_index_bytes: int = 0
    kernels: int = 0  # table-batched kernels holding them (each with its metadata)


@dataclass
class RankMemory(HeldMemory):
    """One rank's embedding memory (``HeldMemory``) beside the plan's count for it
    (``estimate_bytes``, ``backing_estimate_bytes``), and the process's or allocator's peak
    apart."""

    rank: int = 0
    process_peak_bytes: int = 0
    process_peak: str = ""
    estimate_bytes: int = 0
    backing_estimate_bytes: dict[str, int] = field(default_factory=dict)
    plan: int = 0  # which of a run's plans (``RunConfig.plans``): 0 unless plans took turns

    @property
    def ratio(self) -> float:
        """The plan's estimate over the measured device bytes (1.0 when both are 0)."""
        if self.device_bytes == 0:
            return 1.0 if self.estimate_bytes == 0 else float("inf")
        return self.estimate_bytes / self.device_bytes

    @property
    def uncounted_bytes(self) -> int:
        """Held bytes the plan's count leaves out by design: excess cache slots, and at most
        ``KERNEL_METADATA_BYTES`` per kernel."""
        return self.excess_slot_bytes + KERNEL_METADATA_BYTES * self.kernels

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def with_estimates(plans: list[Plan], measured: list[RankMemory]) -> list[RankMemory]:
    """``measured`` with its plan's counts filled in for each rank (``plans``: the run's)."""
    for m in measured:
        plan = plans[m.plan]
        used = plan.memory_used_bytes()
        m.estimate_bytes = int(used[m.rank]) if m.rank < len(used) else 0
        backing: dict[str, int] = {}
        for s in plan.shards_on(m.rank):
            if not s.tier.on_device:
                backing[s.tier.memory] = backing.get(s.tier.memory, 0) + s.backing_bytes(plan.bytes_per_element,
                                                                                          plan.optimizer)
        m.backing_estimate_bytes = backing
    return measured


def format_memory(memory: list[RankMemory]) -> str:
    """Lines of ``neuroshard train``'s report: per rank the plan's estimate, the measured
    embedding bytes, their ratio, backing stores (if any) and the process's peak."""
    if not memory:
        return ""
    lines = ["embedding memory per rank (weights, optimizer state, caches and their bookkeeping), the plan's "
             "estimate beside what the run held (held includes each kernel's own offsets and counters, under "
             f"{format_bytes(KERNEL_METADATA_BYTES)}, which plans do not count):"]
    several = len({m.plan for m in memory}) > 1
    for m in memory:
        line = (f"  {f'plan {m.plan} ' if several else ''}rank {m.rank}: estimate {m.estimate_bytes:,} B, held "
                f"{m.device_bytes:,} B ({m.ratio:.3f}x)")
        if m.excess_slot_bytes:
            line += f", of which {format_bytes(m.excess_slot_bytes)} cache slots beyond the caches' capacity"
        for tier in sorted(set(m.backing_bytes) | set(m.backing_estimate_bytes)):
            line += (f"; {tier} backing estimate {format_bytes(m.backing_estimate_bytes.get(tier, 0))}, held "
                     f"{format_bytes(m.backing_bytes.get(tier, 0))}")
        if m.cache_index_bytes:
            line += f" and a cache index of {format_bytes(m.cache_index_bytes)}"
        lines.append(line + f"; {m.process_peak} {format_bytes(m.process_peak_bytes)}")
    return "\n".join(lines)
