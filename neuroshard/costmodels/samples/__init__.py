"""Measure real costs: fused embedding kernels and all-to-all communication.

* ``kernel.KernelBenchmark`` — forward+backward of a shard set as one fused kernel.
* ``comm.CommBenchmark`` — all-to-alls between D real ``torch.distributed`` processes.
* ``collect`` — random augmented samples, resumable collection into a dataset folder.
* ``store`` — the dataset folder: ``load_compute_data``, ``load_comm_data``, ``meta.json``.

Heavy imports (torch, fbgemm) happen inside the functions that need them, and the names
below load ``store`` on first use (``neuroshard.on_first_use``).
"""
from ...on_first_use import on_first_use

_ON_FIRST_USE = {name: "store" for name in ("load_compute_data", "load_comm_data", "read_meta", "record_shards",
                                            "compute_arrays", "comm_arrays")}
__getattr__, __dir__ = on_first_use(__name__, _ON_FIRST_USE)

__all__ = sorted(_ON_FIRST_USE)
