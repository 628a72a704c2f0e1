"""TorchRec interop: export our plans as TorchRec ``ParameterSharding`` records
(``export``), import TorchRec plans (``import_plan``), and TorchRec's own planner as a
search baseline (``planner``). TorchRec itself is optional (``guard``)."""
from .guard import require_torchrec, torchrec_available

__all__ = ["require_torchrec", "torchrec_available"]
