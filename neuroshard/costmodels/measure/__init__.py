"""Measure real costs: fused embedding kernels and all-to-all communication.

* ``kernel.KernelBenchmark`` — forward+backward of a shard set as one fused kernel.
* ``comm.CommBenchmark`` — all-to-alls between D real ``torch.distributed`` processes.
* ``collect`` — random augmented samples, resumable collection into a dataset folder.
* ``store`` — the dataset folder: ``load_compute_data``, ``load_comm_data``, ``meta.json``.

Heavy imports (torch, fbgemm) happen inside the functions that need them.
"""
from .store import comm_arrays, compute_arrays, load_comm_data, load_compute_data, read_meta, record_shards

__all__ = ["load_compute_data", "load_comm_data", "read_meta", "record_shards", "compute_arrays", "comm_arrays"]
