"""TorchRec interop: export our plans as TorchRec ``ParameterSharding`` records
(``export``), import TorchRec plans (``import_plan``), TorchRec's own planner as a
search baseline (``baseline``), and ``NeuroShardPlanner``, a TorchRec ``ShardingPlanner``
that plans a model's ``EmbeddingBagCollection``s with NeuroShard (``sharding_planner``,
with ``tables_from_module``). TorchRec itself is optional (``guard``).

``NeuroShardPlanner`` and ``tables_from_module`` load ``sharding_planner`` on first use
(PEP 562): it needs TorchRec (a one-line NeuroShardError without it) and the search
stack with torch, which ``neuroshard export`` and ``plan show`` (readers of ``export``)
do not pay for.
"""
from ..on_first_use import on_first_use
from .guard import require_torchrec, torchrec_available

#: names this package hands out from a submodule loaded on first use
_ON_FIRST_USE = {"NeuroShardPlanner": "sharding_planner", "tables_from_module": "sharding_planner"}
__getattr__, __dir__ = on_first_use(__name__, _ON_FIRST_USE)

__all__ = ["NeuroShardPlanner", "require_torchrec", "tables_from_module", "torchrec_available"]
