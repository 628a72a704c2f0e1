"""NeuroShard: pre-train neural cost models of embedding kernels and communication,
then search sharding plans for DLRM embedding tables against them.

The one call most users need::

    import neuroshard
    plan = neuroshard.shard(neuroshard.TableSet.read("tables.json"), devices=8, memory="16GiB")
"""
from .errors import FormatError, InfeasibleError, InvalidPlanError, NeuroShardError
from .plan import Plan, Shard
from .tables import Table, TableSet
from .version import __version__


def shard(tables, devices: int, memory, **kwargs) -> Plan:
    """Search a sharding plan for ``tables`` over ``devices`` devices of ``memory`` each
    (bytes or a string like ``"16GiB"``), with the measured loop when asked (``calibrate``,
    ``refine``). See ``neuroshard.measured.api.shard``. Imported on first call: ``import
    neuroshard`` stays fast (no torch)."""
    from .measured.api import shard as _shard
    return _shard(tables, devices=devices, memory=memory, **kwargs)


__all__ = ["Table", "TableSet", "Plan", "Shard", "shard", "NeuroShardError", "FormatError",
           "InvalidPlanError", "InfeasibleError", "__version__"]
