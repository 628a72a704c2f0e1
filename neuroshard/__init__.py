"""NeuroShard: pre-train neural cost models of embedding kernels and communication,
then search sharding plans for DLRM embedding tables against them.

The one call most users need::

    import neuroshard
    plan = neuroshard.shard(neuroshard.TableSet.read("tables.json"), devices=8, memory="16GiB")
"""
from .errors import FormatError, InfeasibleError, InvalidPlanError, NeuroShardError
from .plan import Plan, Shard
from .tables import Table, TableSet

__version__ = "0.1.0"


def shard(tables, devices: int, memory, **kwargs) -> Plan:
    """Search a sharding plan for ``tables`` over ``devices`` devices of ``memory`` each
    (bytes or a string like ``"16GiB"``). See ``neuroshard.search.shard``."""
    from .search import shard as _shard
    return _shard(tables, devices=devices, memory=memory, **kwargs)


__all__ = ["Table", "TableSet", "Plan", "Shard", "shard", "NeuroShardError", "FormatError",
           "InvalidPlanError", "InfeasibleError", "__version__"]
