"""The simulator's communication cost: the all-to-all of every device, and the all-reduce of
replicated tables' gradients.

Per device ``d`` (ms at the models' batch size; ``compute_d`` from ``performance``)::

    bwd_d = backward all-to-all of width_d (width_d = sum of the columns of d's shards)
    fwd_d = forward all-to-all of width_d, waiting included: it starts when d is ready,
            skew_d = (compute_d + bwd_d) - max_e (compute_e + bwd_e)

Row-wise partial sums travel in the all-to-all (every row block's columns count in
``width_d``) and are added up by the receiver, so they are charged there, once;
``reduce_ms`` stays in the estimate (zero) for reductions outside the exchange.

With a ``network`` that states hosts (``network_for``), no measured model covers the
network, so the exchange is bytes over bandwidth, in two parts per device: to and from the
``L - 1`` peers on its host over ``intra_host_gbps``, and to and from the ``D - L`` peers
on other hosts over ``inter_host_gbps`` (each part the larger of the bytes sent and
received; the parts add up; forward waiting as above). A column strip whose ``k`` row
blocks all lie on one host is table-row-wise (as TorchRec and ZionEX run it): its partial
sums are reduce-scattered within the host (``reduce_d``, ``(k-1)/k`` of the strip's pooled
output per block, over the intra-host links), and only the sums cross hosts, each block
sending ``1/k`` of the strip's columns. Without hosts, the measured comm models cost the
exchange.

With ``comm_precision`` fp16 or bf16 the exchange moves half the bytes: the measured comm
models, fitted on fp32 exchanges, are given the widths that move as many bytes in fp32
(half), and the hosts' bytes use 2 bytes per element.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..constants import (
    COMM_ELEMENT_BYTES,
    COMM_EXTRAPOLATION,
    DEFAULT_INTER_HOST_GBPS,
    DEFAULT_INTRA_HOST_GBPS,
    default_local_world_size,
)
from ..costmodels.analytic import AnalyticCommModel
from ..costmodels.base import CommAtDevices, CommCostModel, CostModels
from ..topology import Topology


def network_for(topology: Topology | None, num_devices: int, models: CostModels) -> tuple[Topology | None, str]:
    """(the topology the exchange is costed over, or None for the measured model; which
    model serves the exchange, in words, for the plan's provenance): the stated hosts and
    links; else the measured network within ``COMM_EXTRAPOLATION`` x the device counts the
    comm models were measured on, and beyond that the GPU-cluster defaults (hosts of 8,
    TorchRec's bandwidths): a model fitted on 2-4 processes says nothing about 1,024."""
    if topology is not None and topology.hosts_stated:
        return topology, (f"analytic: bytes over the stated links ({topology.local_world_size} devices per host, "
                          f"{topology.intra_host_gbps:g} GB/s within a host, {topology.inter_host_gbps:g} GB/s "
                          f"across hosts)")
    counts = models.comm_device_counts()
    name = type(models.comm).__name__
    span = "" if not counts else f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
    if counts and num_devices > COMM_EXTRAPOLATION * max(counts):
        local = default_local_world_size(num_devices)
        network = Topology(num_devices, local, DEFAULT_INTRA_HOST_GBPS, DEFAULT_INTER_HOST_GBPS)
        return network, (f"analytic: bytes over the GPU-cluster defaults ({local} devices per host, "
                         f"{DEFAULT_INTRA_HOST_GBPS:g} and {DEFAULT_INTER_HOST_GBPS:g} GB/s): the measured {name} "
                         f"covers {span} devices, this plan has {num_devices:,}")
    where = f" ({span} devices)" if counts else ""
    return None, f"measured: {name}{where}"


def bytes_per_ms(gbps: float) -> float:
    return gbps * 1e6  # GB/s = 10**9 bytes per second


class ExchangeCost:
    """The all-to-all's ms per device of placements given as widths (columns sent per device).

    ``comm`` is the measured model bound to the device count, ``network`` the hosts the
    exchange is costed over (None: the measured model), ``scale`` the factor from the
    models' batch size to the tables'."""

    def __init__(self, comm: CommAtDevices, network: Topology | None, num_devices: int, cost_models: CostModels,
                 comm_precision: str, scale: float):
        self.comm = comm
        self.network = network
        self.hosts_stated = network is not None
        self.num_devices = num_devices
        self.cost_models = cost_models
        self.comm_precision = comm_precision
        self.scale = scale

    def element_bytes(self) -> int:
        """Bytes per exchanged element (``comm_precision``)."""
        return COMM_ELEMENT_BYTES[self.comm_precision]

    def widths(self, cols: np.ndarray, strips: np.ndarray | None, devices: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """(D,) columns each device sends in the all-to-all and, when the network states
        hosts, (D,) bytes it reduce-scatters within its host, at the models' batch size (else
        None), for pieces of ``cols`` columns in column ``strips`` (a number per table, first
        column and width; only read with hosts) on ``devices``. With hosts, a strip whose
        ``k > 1`` row blocks lie on one host is table-row-wise: each block sends ``cols / k``
        and reduce-scatters ``(k - 1) / k`` of the strip's partial sums; every other piece
        sends its columns."""
        if not self.hosts_stated:
            return np.bincount(devices, weights=cols, minlength=self.num_devices), None
        strips, inverse, blocks = np.unique(strips, return_inverse=True, return_counts=True)
        hosts = self.network.host_of()[devices]
        low = np.full(len(strips), np.iinfo(np.int64).max)
        high = np.full(len(strips), -1)
        np.minimum.at(low, inverse, hosts)
        np.maximum.at(high, inverse, hosts)
        k = blocks[inverse].astype(np.float64)
        one_host = ((blocks > 1) & (low == high))[inverse]
        sent = np.where(one_host, cols / k, cols)
        reduced = np.where(one_host, self.cost_models.batch_size * cols * (k - 1) / k, 0.0) * self.element_bytes()
        return (np.bincount(devices, weights=sent, minlength=self.num_devices),
                np.bincount(devices, weights=reduced, minlength=self.num_devices))

    def host_ms(self, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, D) intra- and inter-host ms of one all-to-all (one direction) of ``widths``
        columns per device, at the models' batch size: each device sends ``B / D`` samples'
        columns to every peer and receives the peers' columns for its ``B / D`` samples."""
        topo, dev = self.network, self.num_devices
        share = self.cost_models.batch_size / dev * self.element_bytes()  # bytes per column and peer
        host = topo.host_of()
        on_host = np.stack([widths[:, host == h].sum(axis=1) for h in range(topo.num_hosts)], axis=1)[:, host]
        local = topo.local_world_size
        intra_bytes = np.maximum(widths * (local - 1), on_host - widths) * share
        inter_bytes = np.maximum(widths * (dev - local), widths.sum(axis=1, keepdims=True) - on_host) * share
        return (intra_bytes / bytes_per_ms(topo.intra_host_gbps),
                inter_bytes / bytes_per_ms(topo.inter_host_gbps))

    def terms(self, compute: np.ndarray, widths: np.ndarray, reduce_bytes: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any, Any]:
        """(forward, backward, reduce, intra-host, inter-host) ms of plans whose per-device
        compute is ``compute`` (P, D) and widths ``widths`` (P, D): the first three at the
        models' batch size (forward waiting included), the host parts (None without hosts)
        of both directions at the tables' batch size."""
        num, dev = compute.shape
        intra = inter = None
        if self.hosts_stated:
            intra, inter = self.host_ms(widths)
            bwd = intra + inter
            reduce = reduce_bytes / bytes_per_ms(self.network.intra_host_gbps)
            ready = compute + bwd + reduce
            fwd = bwd + (ready.max(axis=1, keepdims=True) - ready)
            intra, inter = 2 * intra * self.scale, 2 * inter * self.scale
        else:  # the comm models were measured on fp32 exchanges: fewer bytes per column = fewer columns
            sent = widths * (self.element_bytes() / 4)
            bwd = self.comm.predict_backward(sent)
            ready = compute + bwd
            fwd = self.comm.predict_forward(sent, ready - ready.max(axis=1, keepdims=True))
            reduce = np.zeros((num, dev))  # row-wise partial sums are in ``widths`` (module docstring)
        return fwd, bwd, reduce, intra, inter

    def alone_ms(self, widths: np.ndarray, reduce_bytes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(D,) forward and (D,) backward ms of one plan's exchange of (D,) ``widths``, without
        waiting for other devices, at the tables' batch size; with hosts, the row-wise
        reduce-scatter is part of the forward."""
        if self.hosts_stated:
            intra, inter = self.host_ms(widths[None, :])
            bwd = (intra + inter)[0]
            fwd = bwd + reduce_bytes / bytes_per_ms(self.network.intra_host_gbps)
        else:
            sent = widths[None, :] * (self.element_bytes() / 4)
            bwd = self.comm.predict_backward(sent)[0]
            fwd = self.comm.predict_forward(sent, np.zeros_like(sent))[0]
        return fwd * self.scale, bwd * self.scale


def ring_allreduce_ms(num_devices: int, topology: Topology | None, comm: CommCostModel, gradient_bytes: float
                      ) -> float:
    """Ring all-reduce of ``gradient_bytes`` over ``num_devices`` devices, in ms: with a
    topology that states hosts, the ring's bytes over its slowest link (the inter-host
    bandwidth when there are several hosts); else the comm model's fitted reduction
    constants (call, per peer, per byte)."""
    devices = num_devices
    if devices < 2 or gradient_bytes <= 0:
        return 0.0
    ring_bytes = 2.0 * (devices - 1) / devices * gradient_bytes
    if topology is not None and topology.hosts_stated:
        gbps = topology.inter_host_gbps if topology.num_hosts > 1 else topology.intra_host_gbps
        return float(ring_bytes / (gbps * 1e6))  # GB/s = 1e6 bytes per ms
    model = comm
    analytic = model if isinstance(model, AnalyticCommModel) else getattr(model, "analytic", None)
    one, per_peer, per_byte = (analytic.coefs[2] if analytic is not None else AnalyticCommModel.REDUCE_DEFAULTS)
    return float(one + per_peer * (devices - 1) + per_byte * ring_bytes)


def allreduce_ms(sim: Any, gradient_bytes: float) -> float:
    """``ring_allreduce_ms`` over a simulator's devices, topology and comm model."""
    return ring_allreduce_ms(sim.num_devices, getattr(sim, "topology", None), sim.cost_models.comm, gradient_bytes)
