"""NeuroShard: pre-train neural cost models of embedding kernels and communication,
then search sharding plans for DLRM embedding tables against them.

The one call most users need::

    import neuroshard
    plan = neuroshard.shard(neuroshard.TableSet.read("tables.json"), devices=8, memory="16GiB")
"""
import os as _os

from .constants import HUGE_PAGES_ENV
from .errors import FormatError, InfeasibleError, InvalidPlanError, NeuroShardError
from .plan import Plan, Shard
from .tables import Table, TableSet
from .version import __version__

# PyTorch's CPU allocator puts every allocation of 2 MiB or more in transparent huge pages when
# this is "1", read at the process's first allocation (set it to "0" before importing NeuroShard
# to keep the default pages). Timing runs and the training runtime's ranks (which inherit it)
# then keep tables, lookups and pooled outputs in huge pages, as a GPU keeps its tables in large
# pages: on this project's VMs a device moved half as far between runs (constants.TIMING_HUGE_PAGES).
_os.environ.setdefault(HUGE_PAGES_ENV, "1")


def shard(tables, devices: int, memory, **kwargs) -> Plan:
    """Search a sharding plan for ``tables`` over ``devices`` devices of ``memory`` each
    (bytes or a string like ``"16GiB"``), with the measured loop when asked (``calibrate``,
    ``refine``). See ``neuroshard.measured.api.measured_search``. Imported on first call: ``import
    neuroshard`` stays fast (no torch)."""
    from .measured.api import measured_search
    return measured_search(tables, devices=devices, memory=memory, **kwargs)


__all__ = ["Table", "TableSet", "Plan", "Shard", "shard", "NeuroShardError", "FormatError",
           "InvalidPlanError", "InfeasibleError", "__version__"]
