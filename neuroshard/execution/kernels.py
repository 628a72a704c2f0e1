"""Fused embedding kernels: all shards of one device run as one operation.

Shared by the kernel benchmark (``costmodels.samples.kernel``, what the cost models
learn from) and the training runtime (``runtime.sharded``, what a plan is measured
with), so a predicted and a measured cost time the same code.

* ``fbgemm_tbe`` (preferred): fbgemm's table-batched embedding,
  ``SplitTableBatchedEmbeddingBagsCodegen``, one table per shard, sum pooling, its
  optimizer fused into the backward (``optimizers``: exact SGD, exact adagrad, exact
  row-wise adagrad; Adam on CUDA only, fbgemm-gpu-cpu has no CPU kernel for it). On CPU
  (``fbgemm-gpu-cpu``) weights live on the host (``EmbeddingLocation.HOST``,
  ``ComputeDevice.CPU``); on CUDA in device memory. TBE needs widths that are
  multiples of 4: a narrower shard gets zero padding columns that are never read
  out (their gradient is zero, so they stay zero).
* ``embedding_bag`` (fallback when fbgemm is not importable): PyTorch has no
  table-batched op, so shards are fused **per width group**: the shards of equal
  width are stacked into one ``nn.EmbeddingBag`` (rows concatenated, each shard's
  ids shifted by its row offset, one bag per (shard, sample)); the groups (at most
  one per distinct width) run one after another. Backward leaves sparse gradients;
  ``step()`` applies the SGD update.

A step is ``pooled(inputs)``, a backward through the pooled output, then
``step()`` (a no-op for TBE, whose update happens in its backward).

``weights_precision`` is the element type of the weights: ``fp32`` or ``fp16`` (TBE
stores fp16 weights, accumulates in fp32 and returns fp32 pooled outputs; the fallback
keeps fp16 bags and returns their output as fp32). fbgemm-gpu-cpu has no CPU backward
for ``int8`` weights, so int8 is refused for training (``check_weights_precision``).

``weights_buffer`` lets kernels share memory: the weights are carved from the start
of one flat tensor of the weights' element type instead of being allocated (``neuroshard measure`` times
the devices of a plan one at a time, so they all use one buffer the size of the
largest device). ``local_lookups`` turns a table's batch into one shard's lookups,
for the runtime and for ``measure`` alike.

Heavy imports (torch, fbgemm) happen inside the functions that need them.
"""
from __future__ import annotations

import ctypes
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..constants import HUGE_PAGE_BYTES
from ..errors import NeuroShardError
from ..optimizers import CPU_OPTIMIZERS, FBGEMM_OPTIMIZERS, check_optimizer
from ..validate import check_weights_precision

if TYPE_CHECKING:
    import torch

BACKENDS = ("cpu", "cuda")
#: ``collect --optimizer`` spellings (aliases of ``optimizers.OPTIMIZERS``, recorded as given in cost data)
TIMED_OPTIMIZERS = ("exact_sgd", "exact_rowwise_adagrad")
#: TBE's widths must be multiples of this
TBE_WIDTH_ALIGN = 4


def weights_dtype(precision: str) -> "torch.dtype":
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16}[check_weights_precision(precision)]


def check_trainable_optimizer(optimizer: str, kernel: str, device_type: str) -> str:
    """The optimizer (an alias allowed) when ``kernel`` on ``device_type`` trains with it;
    NeuroShardError saying why not otherwise."""
    optimizer = check_optimizer(optimizer)
    trains = KERNEL_TYPES[kernel].optimizers
    if optimizer not in trains:
        raise NeuroShardError(f"optimizer {optimizer} needs fbgemm's TBE kernel; the {kernel} fallback trains "
                              f"with {', '.join(trains)} only")
    if device_type == "cpu" and optimizer not in CPU_OPTIMIZERS:
        raise NeuroShardError(f"optimizer {optimizer} cannot train on CPU: fbgemm-gpu-cpu's TBE runs "
                              f"{', '.join(CPU_OPTIMIZERS)} there ({optimizer} needs CUDA)")
    return optimizer


def fbgemm_available(backend: str = "cpu") -> bool:
    """Whether fbgemm's table-batched embedding can run on ``backend``."""
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen  # noqa: F401
    except Exception:  # ImportError, or a library load error of a mismatched build
        return False
    if backend == "cuda":
        import torch
        return torch.cuda.is_available()
    return True


def resolve_kernel(kernel: str, backend: str) -> str:
    """``auto`` -> the best kernel available; an unknown name -> NeuroShardError."""
    if backend not in BACKENDS:
        raise NeuroShardError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if kernel == "auto":
        return "fbgemm_tbe" if fbgemm_available(backend) else "embedding_bag"
    if kernel not in KERNEL_TYPES:
        raise NeuroShardError(f"unknown kernel {kernel!r}; choose one of auto, {', '.join(KERNEL_TYPES)}")
    if kernel == "fbgemm_tbe" and not fbgemm_available(backend):
        raise NeuroShardError(f"kernel fbgemm_tbe is not available for backend {backend} "
                              f"(install fbgemm-gpu{'-cpu' if backend == 'cpu' else ''})")
    if not KERNEL_TYPES[kernel].available(backend):
        raise NeuroShardError(f"kernel {kernel} is not available for backend {backend}")
    return kernel


@dataclass
class FusedInputs:
    """One batch's lookups of all shards, laid out for the kernel (build it once, outside
    any timing): TBE gets one (indices, offsets) pair, ``embedding_bag`` one per width group."""

    batch_size: int
    tensors: list[tuple["torch.Tensor", "torch.Tensor"]]


def local_lookups(rows: np.ndarray, lengths: np.ndarray, row_offset: int, num_rows: int, table_rows: int,
                  allocated_rows: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One shard's (indices, offsets) from its table's batch (``rows``: row ids,
    ``lengths``: lookups per sample): the lookups inside rows [row_offset, +num_rows),
    made local to the shard and folded onto its ``allocated_rows`` (the row cap)."""
    import torch
    if num_rows == table_rows:
        local, local_lengths = rows, lengths
    else:
        inside = (rows >= row_offset) & (rows < row_offset + num_rows)
        owner = np.repeat(np.arange(lengths.size), lengths)
        local = rows[inside] - row_offset
        local_lengths = np.bincount(owner[inside], minlength=lengths.size)
    if allocated_rows < num_rows:
        local = local % allocated_rows
    offsets = np.concatenate([[0], np.cumsum(local_lengths)[:-1]]).astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(local, dtype=np.int64)), torch.from_numpy(offsets)


#: Linux ``madvise`` advice for transparent huge pages, on and off (``<sys/mman.h>``)
_MADV_HUGEPAGE, _MADV_NOHUGEPAGE = 14, 15
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
_SMALL_PAGE_BYTES = 4096


def advise_huge_pages(tensor: "torch.Tensor", huge: bool = True) -> bool:
    """Ask Linux to back ``tensor``'s memory (a fresh CPU tensor not yet written) with
    transparent huge pages, or with ``huge=False`` to keep it in small pages; True when the
    kernel accepted the advice (and, for huge pages, its THP mode allows them). PyTorch
    offers this only for a whole process, from an environment variable read at its first
    allocation (``constants.HUGE_PAGES_ENV``), which a process that has already loaded cost
    models cannot change any more: hence ``madvise`` on the one buffer here."""
    if not sys.platform.startswith("linux") or tensor.device.type != "cpu":
        return False
    try:
        with open(_THP_MODE) as f:
            if huge and "[never]" in f.read():
                return False
        first, last = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
        if huge:  # the whole huge pages inside the tensor
            start, end = -(-first // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES, last // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
        else:  # every small page it touches
            start, end = first // _SMALL_PAGE_BYTES * _SMALL_PAGE_BYTES, -(-last // _SMALL_PAGE_BYTES) * _SMALL_PAGE_BYTES
        if end <= start:
            return False
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc.madvise(start, end - start, _MADV_HUGEPAGE if huge else _MADV_NOHUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


def huge_page_bytes(tensor: "torch.Tensor") -> int:
    """Bytes of huge pages (``AnonHugePages`` in ``/proc/self/smaps``) in the mapping that
    holds the middle of ``tensor``'s memory: what a timing run's weights really got. 0 where
    that cannot be read (not Linux, not a CPU tensor)."""
    if not sys.platform.startswith("linux") or tensor.device.type != "cpu" or tensor.numel() == 0:
        return 0
    middle = tensor.data_ptr() + tensor.numel() * tensor.element_size() // 2
    inside = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line: its address range
                    low, high = (int(x, 16) for x in head.split("-"))
                    inside = low <= middle < high
                elif inside and head == "AnonHugePages:":
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return 0


def weights_numel(shapes: Sequence[tuple[int, int]], kernel: str) -> int:
    """Elements the weights of ``shapes`` take in ``kernel`` (TBE pads widths to multiples of 4)."""
    align = KERNEL_TYPES[kernel].width_align
    return sum(int(r) * (-(-int(d) // align) * align) for r, d in shapes)


class FusedEmbedding:
    """The shards of one device as one fused embedding with sum pooling and its update.

    ``shapes`` are the (allocated rows, width) of each shard; ``init`` is one value for
    every weight or one (rows, width) tensor per shard. ``lr`` is the learning rate of
    the fused update; ``optimizer`` (``optimizers.OPTIMIZERS`` or an ``exact_*`` alias)
    is the kernel's fused optimizer (``EmbeddingKernel.optimizers``).
    ``weights_precision`` is the weights' element type (``WEIGHTS_PRECISIONS``).
    ``weights_buffer`` (a flat tensor of that type, of at least ``weights_numel(shapes,
    kernel)`` elements) holds the weights instead of a new allocation; its values are
    left as they are (``init`` is not applied), as when timing kernels that share it.
    The work is the registered ``EmbeddingKernel``'s (``KERNEL_TYPES[kernel]``)."""

    def __init__(self, shapes: Sequence[tuple[int, int]], kernel: str = "auto", device: "torch.device | str" = "cpu",
                 lr: float = 0.01, init: "float | Sequence[torch.Tensor]" = 0.01,
                 optimizer: str = "exact_sgd", weights_buffer: "torch.Tensor | None" = None,
                 weights_precision: str = "fp32") -> None:
        import torch
        self.device = torch.device(device)
        self.kernel = resolve_kernel(kernel, self.device.type)
        self.optimizer = check_trainable_optimizer(optimizer, self.kernel, self.device.type)
        self.shapes = [(int(r), int(d)) for r, d in shapes]
        if not self.shapes:
            raise NeuroShardError("a fused embedding needs at least one shard")
        if any(r < 1 or d < 1 for r, d in self.shapes):
            raise NeuroShardError(f"shard shapes must be positive (rows, width), got {self.shapes}")
        if not isinstance(init, (int, float)) and len(init) != len(self.shapes):
            raise NeuroShardError(f"{len(init)} initial weights given for {len(self.shapes)} shards")
        self.lr = lr
        self.weights_precision = check_weights_precision(weights_precision)
        self.dtype = weights_dtype(weights_precision)
        if weights_buffer is not None and weights_buffer.dtype != self.dtype:
            raise NeuroShardError(f"weights buffer of {weights_buffer.dtype} given for {weights_precision} weights")
        if weights_buffer is not None and weights_buffer.numel() < weights_numel(self.shapes, self.kernel):
            raise NeuroShardError(f"weights buffer of {weights_buffer.numel()} floats is smaller than the "
                                  f"{weights_numel(self.shapes, self.kernel)} the shards need")
        try:
            self.impl: EmbeddingKernel = KERNEL_TYPES[self.kernel](self, init, weights_buffer)
        except (RuntimeError, MemoryError) as exc:
            raise NeuroShardError(f"cannot allocate the fused kernel for {len(self.shapes)} shards: "
                                  f"{str(exc).splitlines()[0]}") from None

    @property
    def widths(self) -> list[int]:
        return [d for _, d in self.shapes]

    def prepare(self, per_shard: Sequence[tuple["torch.Tensor", "torch.Tensor"]]) -> FusedInputs:
        """Lay out one batch: ``per_shard`` holds each shard's (indices into its allocated
        rows, offsets), offsets being the B bag starts as ``F.embedding_bag`` takes them."""
        import torch
        if len(per_shard) != len(self.shapes):
            raise NeuroShardError(f"lookups for {len(per_shard)} shards given to a kernel of {len(self.shapes)}")
        batch = int(per_shard[0][1].numel())
        if any(int(off.numel()) != batch for _, off in per_shard):
            raise NeuroShardError("every shard's lookups must cover the same batch")
        per_shard = [(idx.to(self.device, torch.long), off.to(self.device, torch.long)) for idx, off in per_shard]
        return self.impl.prepare(per_shard, batch)

    def pooled(self, inputs: FusedInputs) -> "torch.Tensor":
        """Pooled embeddings of every shard side by side in shard order, (B, sum of widths).
        A backward through it computes the gradients (and, for TBE, applies the update)."""
        return self.impl.pooled(inputs)

    def forward(self, inputs: "FusedInputs | Sequence[tuple[torch.Tensor, torch.Tensor]]") -> list["torch.Tensor"]:
        """Pooled embeddings, one (B, width) tensor per shard."""
        import torch
        if not isinstance(inputs, FusedInputs):
            inputs = self.prepare(inputs)
        return list(torch.split(self.pooled(inputs), self.widths, dim=1))

    __call__ = forward

    def step(self) -> None:
        """Apply the update after a backward (TBE already did, inside its backward)."""
        self.impl.step()

    def optimizer_state(self) -> list[dict[str, "torch.Tensor"]]:
        """The fused optimizer's state of every shard (fbgemm's names, e.g. ``sum``), CPU
        copies without padding columns; empty dicts for SGD and kernels without state."""
        return self.impl.optimizer_state()

    def weights(self) -> list["torch.Tensor"]:
        """Current weights of every shard, (rows, width) float32 copies on the CPU."""
        return self.impl.weights()


def concat_lookups(parts, row_bases, with_end: bool):
    """Indices (shifted by ``row_bases``) and offsets (shifted by the indices before
    them) of several shards one after another; ``with_end`` appends the total."""
    import torch
    ids, offs, base = [], [], 0
    for (idx, off), rows in zip(parts, row_bases):
        ids.append(idx + rows if rows else idx)
        offs.append(off + base)
        base += int(idx.numel())
    if with_end:
        offs.append(torch.tensor([base], dtype=torch.long, device=offs[0].device))
    return torch.cat(ids), torch.cat(offs)


class EmbeddingKernel(ABC):
    """One kernel: how a device's shards are laid out, run as one sum-pooled operation and
    updated. A subclass per kernel, registered in ``KERNEL_TYPES`` (``register_kernel``);
    ``FusedEmbedding`` checks the arguments and hands the work to it. ``fused`` is the
    owning ``FusedEmbedding`` (its ``shapes``, ``widths``, ``device``, ``dtype``, ``lr``,
    ``optimizer``, ``weights_precision``)."""

    #: the kernel's name (``--kernel``, cost data's ``kernel`` field)
    name: ClassVar[str] = ""
    #: widths are padded to multiples of this in memory
    width_align: ClassVar[int] = 1
    #: the optimizers it fuses (``optimizers.OPTIMIZERS`` names)
    optimizers: ClassVar[tuple[str, ...]] = ("sgd",)
    #: the backends it runs on
    backends: ClassVar[tuple[str, ...]] = BACKENDS

    def __init__(self, fused: "FusedEmbedding", init: "float | Sequence[torch.Tensor]",
                 buffer: "torch.Tensor | None") -> None:
        # ``fused`` is read, not kept: a reference back to it would make a cycle that only the garbage
        # collector frees, and on CUDA ``measure`` frees each device's weights after its turn (an H200
        # ran out of its 140 GiB with the devices of 7 plans of 8 devices still held)
        self.kernel, self.shapes, self.widths, self.device = fused.kernel, fused.shapes, fused.widths, fused.device
        self.dtype, self.lr, self.optimizer = fused.dtype, fused.lr, fused.optimizer
        self.weights_precision = fused.weights_precision

    @classmethod
    def available(cls, backend: str) -> bool:
        """Whether the kernel can run on ``backend`` here (its libraries import)."""
        return backend in cls.backends

    @abstractmethod
    def prepare(self, per_shard: list[tuple["torch.Tensor", "torch.Tensor"]], batch: int) -> FusedInputs:
        """One batch's per-shard (indices, offsets), already on the device, laid out for the kernel."""

    @abstractmethod
    def pooled(self, inputs: FusedInputs) -> "torch.Tensor":
        """(B, sum of widths) pooled embeddings in shard order; a backward computes the gradients."""

    def step(self) -> None:
        """Apply the update after a backward (nothing when the backward applied it)."""

    def optimizer_state(self) -> list[dict[str, "torch.Tensor"]]:
        """The fused optimizer's state per shard (empty dicts when it keeps none)."""
        return [{} for _ in self.shapes]

    @abstractmethod
    def weights(self) -> list["torch.Tensor"]:
        """Current weights of every shard, (rows, width) float32 copies on the CPU."""


class TBEKernel(EmbeddingKernel):
    """fbgemm's table-batched embedding: one table per shard, sum pooling, the optimizer
    fused into the backward; widths padded to multiples of ``TBE_WIDTH_ALIGN``."""

    name = "fbgemm_tbe"
    width_align = TBE_WIDTH_ALIGN
    optimizers = tuple(FBGEMM_OPTIMIZERS)

    @classmethod
    def available(cls, backend: str) -> bool:
        return fbgemm_available(backend)

    def __init__(self, fused: "FusedEmbedding", init, buffer) -> None:
        super().__init__(fused, init, buffer)
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
        cuda = self.device.type == "cuda"
        location = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
        compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
        padded = [-(-d // TBE_WIDTH_ALIGN) * TBE_WIDTH_ALIGN for d in self.widths]
        specs = [(r, p, location, compute) for (r, _), p in zip(self.shapes, padded)]
        optimizer = getattr(EmbOptimType, FBGEMM_OPTIMIZERS[self.optimizer])
        shared = None
        if buffer is not None:
            if cuda:
                raise NeuroShardError("a shared weights buffer is for host (CPU) weights only")
            shared = {"weights": buffer[:weights_numel(self.shapes, self.kernel)]}
        precision = {"fp32": SparseType.FP32, "fp16": SparseType.FP16}[self.weights_precision]
        self._tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=optimizer, learning_rate=self.lr,
                                                          device=self.device, preallocated_host_buffers=shared,
                                                          weights_precision=precision,
                                                          output_dtype=SparseType.FP32)
        # Output columns to keep when a width was padded (None: the output is already right).
        self._keep = None
        if padded != self.widths:
            keep, base = [], 0
            for d, p in zip(self.widths, padded):
                keep.extend(range(base, base + d))
                base += p
            self._keep = torch.tensor(keep, dtype=torch.long, device=self.device)
        if buffer is not None:
            return
        with torch.no_grad():  # writing every weight also maps every page before timing
            if isinstance(init, (int, float)) and self._keep is None:
                (self._tbe.weights_dev if cuda else self._tbe.weights_host).fill_(float(init))
            else:
                for i, w in enumerate(self._tbe.split_embedding_weights()):
                    d = self.widths[i]
                    w[:, d:].zero_()
                    if isinstance(init, (int, float)):
                        w[:, :d].fill_(float(init))
                    else:
                        w[:, :d].copy_(init[i])

    def prepare(self, per_shard, batch: int) -> FusedInputs:
        return FusedInputs(batch, [concat_lookups(per_shard, [0] * len(per_shard), True)])

    def pooled(self, inputs: FusedInputs) -> "torch.Tensor":
        indices, offsets = inputs.tensors[0]
        out = self._tbe(indices, offsets)
        return out if self._keep is None else out.index_select(1, self._keep)

    def optimizer_state(self) -> list[dict[str, "torch.Tensor"]]:
        return [{k: (v[:, :d] if v.dim() == 2 else v).detach().cpu().clone() for k, v in state.items()}
                for state, d in zip(self._tbe.get_optimizer_state() or [{}] * len(self.shapes), self.widths)]

    def weights(self) -> list["torch.Tensor"]:
        import torch
        return [w[:, :d].detach().cpu().to(torch.float32, copy=True)
                for w, d in zip(self._tbe.split_embedding_weights(), self.widths)]


class EmbeddingBagKernel(EmbeddingKernel):
    """PyTorch's ``nn.EmbeddingBag`` (the fallback): no table-batched op, so the shards of
    equal width are stacked into one bag and the width groups run one after another;
    SGD applied by ``step``."""

    name = "embedding_bag"

    def __init__(self, fused: "FusedEmbedding", init, buffer) -> None:
        super().__init__(fused, init, buffer)
        import torch
        groups: dict[int, list[int]] = {}
        for i, d in enumerate(self.widths):
            groups.setdefault(d, []).append(i)
        self._groups = list(groups.items())  # (width, shard indices)
        self._row_base: dict[int, int] = {}  # shard -> first row in its group's bag
        self._bags = []
        used = 0  # floats of the shared buffer taken so far
        for width, members in self._groups:
            base = 0
            for i in members:
                self._row_base[i] = base
                base += self.shapes[i][0]
            if buffer is not None:
                shared = buffer[used:used + base * width].view(base, width)
                used += base * width
                bag = torch.nn.EmbeddingBag(base, width, mode="sum", sparse=True, _weight=shared)
                self._bags.append(bag)
                continue
            # built on its device from an uninitialised tensor: nn.EmbeddingBag would otherwise draw
            # normal weights on the CPU first (minutes for the GBs of a GPU device, seen on an H200),
            # and every weight is written just below anyway
            weight = torch.empty(base, width, device=self.device, dtype=self.dtype)
            bag = torch.nn.EmbeddingBag(base, width, mode="sum", sparse=True, _weight=weight)
            with torch.no_grad():
                if isinstance(init, (int, float)):
                    bag.weight.fill_(float(init))
                else:
                    for i in members:
                        start = self._row_base[i]
                        bag.weight[start:start + self.shapes[i][0]].copy_(init[i])
            self._bags.append(bag)
        self._sgd = torch.optim.SGD([b.weight for b in self._bags], lr=self.lr)

    def prepare(self, per_shard, batch: int) -> FusedInputs:
        return FusedInputs(batch, [concat_lookups([per_shard[i] for i in members],
                                                  [self._row_base[i] for i in members], False)
                                   for _, members in self._groups])

    def pooled(self, inputs: FusedInputs) -> "torch.Tensor":
        import torch
        batch = inputs.batch_size
        per_shard: list = [None] * len(self.shapes)
        for bag, (width, members), (ids, offsets) in zip(self._bags, self._groups, inputs.tensors):
            out = bag(ids, offsets).float()
            if len(self._groups) == 1 and len(members) == 1:
                return out
            for j, i in enumerate(members):
                per_shard[i] = out[j * batch:(j + 1) * batch]
        return torch.cat(per_shard, dim=1)

    def step(self) -> None:
        self._sgd.step()
        self._sgd.zero_grad(set_to_none=True)

    def weights(self) -> list["torch.Tensor"]:
        import torch
        out: list = [None] * len(self.shapes)
        for bag, (_, members) in zip(self._bags, self._groups):
            for i in members:
                start = self._row_base[i]
                out[i] = bag.weight[start:start + self.shapes[i][0]].detach().cpu().to(torch.float32, copy=True)
        return out


#: every kernel by name; ``auto`` picks fbgemm_tbe where it is available, else embedding_bag
KERNEL_TYPES: dict[str, type[EmbeddingKernel]] = {k.name: k for k in (TBEKernel, EmbeddingBagKernel)}


def register_kernel(kernel: type[EmbeddingKernel]) -> type[EmbeddingKernel]:
    """Add ``kernel`` (an ``EmbeddingKernel`` subclass with a new ``name``) to ``KERNEL_TYPES``;
    usable as a class decorator. ``--kernel`` choices are read when a parser is built."""
    if not (isinstance(kernel, type) and issubclass(kernel, EmbeddingKernel)) or not kernel.name:
        raise NeuroShardError(f"a kernel must be an EmbeddingKernel subclass with a name, got {kernel!r}")
    if kernel.name in KERNEL_TYPES or kernel.name == "auto":
        raise NeuroShardError(f"kernel {kernel.name!r} is already registered")
    KERNEL_TYPES[kernel.name] = kernel
    return kernel


def kernel_names() -> tuple[str, ...]:
    """The registered kernels' names (``--kernel`` choices besides ``auto``)."""
    return tuple(KERNEL_TYPES)
