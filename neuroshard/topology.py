"""The cluster a plan is for: hosts, their links, and devices that may differ.

A ``Topology`` says how many devices share a host (``local_world_size``), the bandwidth
of the links within a host and across hosts, and, per device, its memory and relative
speed. It is read from a ``neuroshard.topology/v1`` file (``docs/formats.md``) or built
from ``neuroshard search`` flags, and a plan records it in its ``topology`` field.

* No topology: every device is alike on one flat network, the network the
  communication models measured (estimates exactly as without this module).
* Hosts stated (``local_world_size``): the all-to-all is costed as bytes over the
  stated bandwidths, split into its intra- and inter-host parts (``Simulator``);
  table-row-wise shards reduce on the fast links within a host.
* Per-device memory: a list, one entry per device; the plan's ``device_memory_bytes``
  is its largest entry (a search with the same memory everywhere records no list). Relative speed divides a device's predicted compute.

Defaults for a GPU cluster are TorchRec's planner constants (``torchrec.distributed.
planner.constants``): ``INTRA_NODE_BANDWIDTH`` 600 GB/s (NVLink of an 8-GPU A100 host) and
``CROSS_NODE_BANDWIDTH`` 12.5 GB/s (one 100 Gbit/s NIC per GPU), and 8 GPUs per host.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .constants import (
    DEFAULT_HOST_LINK_GBPS,
    DEFAULT_INTER_HOST_GBPS,
    DEFAULT_INTRA_HOST_GBPS,
    DEFAULT_SSD_GBPS,
    DEFAULT_SSD_IOPS,
    default_local_world_size,
)
from .errors import FormatError, NeuroShardError
from .units import format_bytes
from .validate import check_devices, check_format, check_memory, check_number, read_json

TOPOLOGY_FORMAT = "neuroshard.topology/v1"
#: most GB/s a link may be given (a typo guard: 100 TB/s)
MAX_GBPS = 1e5
#: slowest and fastest relative device speed accepted
SPEED_RANGE = (0.01, 100.0)
_KEYS = ("local_world_size", "intra_host_gbps", "inter_host_gbps", "device_memory_bytes", "relative_speed",
         "host_memory_bytes", "ssd_bytes", "host_link_gbps", "ssd_gbps", "ssd_iops")
#: the memory-tier fields: capacities per host, and the links to a device (``neuroshard.tiers``)
TIER_KEYS = _KEYS[5:]
#: most random reads per second an SSD may be given (a typo guard)
MAX_IOPS = 1e9


@dataclass(frozen=True)
class Topology:
    """``num_devices`` devices, ``local_world_size`` per host (None: one host, the network
    the communication models measured); link bandwidths in GB/s; per-device memory
    (bytes) and relative speed (1.0 = the measured device), None when all alike."""

    num_devices: int
    local_world_size: int | None = None
    intra_host_gbps: float | None = None
    inter_host_gbps: float | None = None
    device_memory_bytes: tuple[int, ...] | None = None
    relative_speed: tuple[float, ...] | None = None
    # Memory tiers (``neuroshard.tiers``): host memory and SSD bytes per host (None: that tier
    # is not available), the host-to-device link per device, the SSD's read GB/s and IOPS per
    # host (None: the documented defaults, ``tier_links``). Hosts are ``tier_host_of``'s.
    host_memory_bytes: int | None = None
    ssd_bytes: int | None = None
    host_link_gbps: float | None = None
    ssd_gbps: float | None = None
    ssd_iops: float | None = None

    def __post_init__(self) -> None:
        # The one place the link defaults are filled in (make_topology checks, then builds
        # through here): stating hosts or a link states hosts, and what is left out takes
        # the GPU-cluster defaults (one host of all devices when only links are given).
        if any(v is not None for v in (self.local_world_size, self.intra_host_gbps, self.inter_host_gbps)):
            for name, default in (("local_world_size", self.num_devices),
                                  ("intra_host_gbps", DEFAULT_INTRA_HOST_GBPS),
                                  ("inter_host_gbps", DEFAULT_INTER_HOST_GBPS)):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)

    @property
    def hosts_stated(self) -> bool:
        """Whether hosts and links are given: communication is then costed from the bandwidths."""
        return self.local_world_size is not None

    @property
    def num_hosts(self) -> int:
        return self.num_devices // self.local_world_size if self.hosts_stated else 1

    def host_of(self) -> np.ndarray:
        """(D,) host number of every device (ranks ``h*L .. h*L+L-1`` on host ``h``)."""
        return np.arange(self.num_devices) // (self.local_world_size or self.num_devices)

    def memory_limits(self, memory_bytes: int) -> np.ndarray:
        """(D,) memory of every device (``memory_bytes`` each when not given per device)."""
        if self.device_memory_bytes is None:
            return np.full(self.num_devices, float(memory_bytes))
        return np.array(self.device_memory_bytes, dtype=np.float64)

    def tier_host_of(self) -> np.ndarray:
        """(D,) host of every device for the memory tiers: hosts of ``ranks_per_host`` devices
        (the stated ``local_world_size``, else TorchRec's default of 8 or all devices)."""
        return np.arange(self.num_devices) // ranks_per_host(self, self.num_devices)

    def tier_links(self) -> dict:
        """The host link (GB/s per device) and SSD figures (GB/s, IOPS per host), defaults filled in."""
        return {"host_link_gbps": self.host_link_gbps or DEFAULT_HOST_LINK_GBPS,
                "ssd_gbps": self.ssd_gbps or DEFAULT_SSD_GBPS,
                "ssd_iops": self.ssd_iops or DEFAULT_SSD_IOPS}

    def capacity(self, memory: str) -> int | None:
        """Bytes per host of the ``host`` or ``ssd`` tier (None: not available)."""
        return self.host_memory_bytes if memory == "host" else self.ssd_bytes

    def speeds(self) -> np.ndarray:
        """(D,) relative speed of every device."""
        return np.ones(self.num_devices) if self.relative_speed is None else np.array(self.relative_speed)

    def tier_fields(self) -> dict:
        """The memory-tier fields as ``make_topology`` keywords."""
        return {k: getattr(self, k) for k in TIER_KEYS}

    def to_dict(self) -> dict:
        """The plan's ``topology`` object: the fields that are set."""
        out: dict = {}
        for key in _KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def describe(self) -> str:
        """One line for ``plan show`` and the search's output."""
        parts = []
        if self.hosts_stated:
            parts.append(f"{self.num_hosts} host{'s' if self.num_hosts > 1 else ''} x {self.local_world_size} "
                         f"devices, {self.intra_host_gbps:g} GB/s within a host, {self.inter_host_gbps:g} GB/s "
                         f"per device across hosts")
        else:
            parts.append(f"{self.num_devices} devices on one host (measured network)")
        if self.device_memory_bytes is not None:
            parts.append("memory " + _runs([format_bytes(m) for m in self.device_memory_bytes]))
        if self.relative_speed is not None:
            parts.append("relative speed " + _runs([f"{s:g}" for s in self.relative_speed]))
        if self.host_memory_bytes is not None or self.ssd_bytes is not None:
            links = self.tier_links()
            per_host = []
            if self.host_memory_bytes is not None:
                per_host.append(f"host memory {format_bytes(self.host_memory_bytes)}")
            if self.ssd_bytes is not None:
                per_host.append(f"SSD {format_bytes(self.ssd_bytes)} ({links['ssd_gbps']:g} GB/s, "
                                f"{links['ssd_iops']:,.0f} reads/s)")
            parts.append(" and ".join(per_host) + f" per host, host link {links['host_link_gbps']:g} GB/s per device")
        return "; ".join(parts)

    @classmethod
    def from_dict(cls, data: Any, num_devices: int | None = None, source: str = "topology") -> "Topology":
        """A topology from a file's or a plan's object (``num_devices`` from the plan or the
        command when the object does not say); one-line FormatError naming the field."""
        if not isinstance(data, Mapping):
            raise FormatError(f"{source}: a topology must be a JSON object")
        check_format(data, TOPOLOGY_FORMAT, source, optional=True)
        given = data.get("num_devices")
        if given is not None:
            given = _field(check_devices, given, source, "num_devices")
            if num_devices is not None and given != num_devices:
                raise FormatError(f"{source}: field 'num_devices' is {given}, but the plan or command has "
                                  f"{num_devices} devices")
        devices = num_devices if num_devices is not None else given
        if devices is None:
            raise FormatError(f"{source}: field 'num_devices' is missing")
        return make_topology(devices, data.get("local_world_size"), data.get("intra_host_gbps"),
                             data.get("inter_host_gbps"), data.get("device_memory_bytes"),
                             data.get("relative_speed"), source, error=FormatError,
                             **{k: data.get(k) for k in TIER_KEYS})

    @classmethod
    def read(cls, path: str | Path, num_devices: int | None = None) -> "Topology":
        path = Path(path)
        return cls.from_dict(read_json(path, "topology file"), num_devices, str(path))


def _runs(values: Sequence[str]) -> str:
    """``a, a, b`` as ``2x a, 1x b`` (per-device lists stay short in a summary)."""
    out: list[list] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1][0] += 1
        else:
            out.append([1, v])
    return ", ".join(v if n == 1 else f"{n}x {v}" for n, v in out)


def _field(check, value: Any, source: str, key: str, error: type = FormatError) -> Any:
    try:
        return check(value)
    except NeuroShardError as exc:
        raise error(f"{source}: field '{key}': {exc}") from None


def make_topology(num_devices: int, local_world_size: Any = None, intra_host_gbps: Any = None,
                  inter_host_gbps: Any = None, device_memory_bytes: Any = None, relative_speed: Any = None,
                  source: str = "topology", error: type = NeuroShardError, *, host_memory_bytes: Any = None,
                  ssd_bytes: Any = None, host_link_gbps: Any = None, ssd_gbps: Any = None,
                  ssd_iops: Any = None) -> Topology:
    """A checked ``Topology``. Stating any link (or ``local_world_size``) states hosts: what
    is left out takes the GPU-cluster defaults (``DEFAULT_*``; one host of all devices
    when only bandwidths are given). Memory: one size for all or one per device."""
    check_devices(num_devices, "num_devices")
    local = None if local_world_size is None else _field(
        lambda v: check_devices(v, "value"), local_world_size, source, "local_world_size", error)
    if local is not None and num_devices % local:
        raise error(f"{source}: field 'local_world_size' ({local} devices per host) must divide the "
                    f"{num_devices} devices")
    intra, inter = (None if v is None else
                    _field(lambda v: check_number(v, "value", 0.0, MAX_GBPS, low_open=True), v, source, k, error)
                    for v, k in ((intra_host_gbps, "intra_host_gbps"), (inter_host_gbps, "inter_host_gbps")))
    memory = None
    if device_memory_bytes is not None:
        sizes = device_memory_bytes if isinstance(device_memory_bytes, list) else [device_memory_bytes]
        if isinstance(device_memory_bytes, list) and len(sizes) != num_devices:
            raise error(f"{source}: field 'device_memory_bytes' lists {len(sizes)} devices, the plan or command "
                        f"has {num_devices}")
        sizes = [_field(check_memory, m, source, "device_memory_bytes", error) for m in sizes]
        memory = tuple(sizes * num_devices if len(sizes) == 1 else sizes)
    speed = None
    if relative_speed is not None:
        if not (isinstance(relative_speed, list) and len(relative_speed) == num_devices):
            raise error(f"{source}: field 'relative_speed' must list one number per device ({num_devices}), "
                        f"got {relative_speed!r}"[:300])
        speed = tuple(_field(lambda v: check_number(v, "value", *SPEED_RANGE), s, source, "relative_speed", error)
                      for s in relative_speed)
        speed = None if all(s == 1.0 for s in speed) else speed
    host_memory, ssd = (None if v is None else _field(check_memory, v, source, k, error)
                        for v, k in ((host_memory_bytes, "host_memory_bytes"), (ssd_bytes, "ssd_bytes")))
    link, ssd_rate = (None if v is None else
                      _field(lambda v: check_number(v, "value", 0.0, MAX_GBPS, low_open=True), v, source, k, error)
                      for v, k in ((host_link_gbps, "host_link_gbps"), (ssd_gbps, "ssd_gbps")))
    iops = None if ssd_iops is None else _field(lambda v: check_number(v, "value", 0.0, MAX_IOPS, low_open=True),
                                               ssd_iops, source, "ssd_iops", error)
    return Topology(num_devices, local, intra, inter, memory, speed,  # it fills in the links left out
                    host_memory, ssd, link, ssd_rate, iops)


def device_memory(topology: Topology | None, memory_bytes: int) -> int | np.ndarray:
    """What the placers compare with: ``memory_bytes``, or (D,) bytes per device when the
    topology gives per-device memory."""
    if topology is None or topology.device_memory_bytes is None:
        return memory_bytes
    return topology.memory_limits(memory_bytes)


def ranks_per_host(topology: Topology | None, num_devices: int) -> int:
    """Ranks per host: the topology's when it states hosts, else TorchRec's default
    (``constants.default_local_world_size``). The one rule plans, the simulator and the
    task checks use."""
    if topology is not None and topology.hosts_stated:
        return topology.local_world_size
    return default_local_world_size(num_devices)


def resolve_topology(topology: Any, num_devices: int, memory: Any) -> tuple[Topology | None, int | None]:
    """``shard()``'s ``topology`` and ``memory`` arguments as (Topology or None, memory of the
    largest device). ``topology``: None, a ``Topology``, a dict (a file's object) or a path;
    ``memory``: a size, a list of sizes (one per device), or None when the topology has it."""
    if isinstance(topology, (str, Path)):
        topology = Topology.read(topology, num_devices)
    elif isinstance(topology, Mapping):
        topology = Topology.from_dict(topology, num_devices)
    elif topology is not None and not isinstance(topology, Topology):
        raise NeuroShardError(f"topology must be a Topology, a topology file or its object, "
                              f"got {type(topology).__name__}")
    if isinstance(topology, Topology) and topology.num_devices != num_devices:
        raise NeuroShardError(f"topology has {topology.num_devices} devices, but devices={num_devices}")
    if isinstance(memory, (list, tuple)):
        base = topology or Topology(num_devices)
        topology = make_topology(num_devices, base.local_world_size, base.intra_host_gbps, base.inter_host_gbps,
                                 list(memory), list(base.relative_speed) if base.relative_speed else None,
                                 "memory (--memory)", **base.tier_fields())
    elif memory is not None:
        memory_bytes = check_memory(memory)
        if topology is not None and topology.device_memory_bytes is not None:
            raise NeuroShardError("memory is given twice: as one size and per device in the topology; give one")
        return (None if topology == Topology(num_devices) else topology), memory_bytes
    if topology is None or topology.device_memory_bytes is None:
        raise NeuroShardError("memory is missing: give the device memory (or per-device memory in the topology)")
    sizes = topology.device_memory_bytes
    if len(set(sizes)) == 1:  # the same memory everywhere: no per-device list of its own
        topology = replace(topology, device_memory_bytes=None)
    return (None if topology == Topology(num_devices) else topology), max(sizes)


def memory_list(text: str) -> int | list[int]:
    """argparse ``type=`` for ``--memory``: one size (``16GiB``) or a comma list, one per device."""
    import argparse
    try:
        if "," in text:
            return [check_memory(part.strip()) for part in text.split(",")]
        return check_memory(text)
    except NeuroShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


memory_list.__name__ = "a memory size or a comma list of sizes"


def topology_from_options(path: str | None, num_devices: int, local_world_size: int | None,
                          intra_host_gbps: float | None, inter_host_gbps: float | None,
                          tiers: Mapping[str, Any] | None = None) -> Topology | None:
    """The topology of ``--topology FILE`` with ``--local-world-size`` / ``--intra-host-gbps`` /
    ``--inter-host-gbps`` and the memory-tier flags (``tiers``: ``TIER_KEYS`` to values,
    None where not given) replacing the file's fields; None when none is given."""
    tiers = {k: v for k, v in (tiers or {}).items() if v is not None}
    unknown = sorted(set(tiers) - set(TIER_KEYS))
    if unknown:
        raise NeuroShardError(f"unknown topology field {unknown[0]!r}")
    if path is None and not tiers and all(v is None for v in (local_world_size, intra_host_gbps, inter_host_gbps)):
        return None
    base = Topology.read(path, num_devices) if path is not None else Topology(num_devices)
    source = path or ("topology options (--local-world-size, --intra-host-gbps, --inter-host-gbps, --host-memory, "
                      "--ssd, --host-link-gbps, --ssd-gbps, --ssd-iops)")
    return make_topology(num_devices,
                         local_world_size if local_world_size is not None else base.local_world_size,
                         intra_host_gbps if intra_host_gbps is not None else base.intra_host_gbps,
                         inter_host_gbps if inter_host_gbps is not None else base.inter_host_gbps,
                         list(base.device_memory_bytes) if base.device_memory_bytes else None,
                         list(base.relative_speed) if base.relative_speed else None, source,
                         error=FormatError if path is not None else NeuroShardError,
                         **{**base.tier_fields(), **tiers})
