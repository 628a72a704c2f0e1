"""TorchRec is an optional dependency: whether it imports, a one-line error when it does not,
and a context that hushes its planner's warnings."""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator

from ..errors import NeuroShardError


def torchrec_available() -> bool:
    try:
        import torchrec.distributed.planner  # noqa: F401
    except Exception:  # torchrec missing, or installed without a working fbgemm
        return False
    return True


def require_torchrec() -> None:
    """Raise a one-line NeuroShardError when TorchRec cannot be imported."""
    if not torchrec_available():
        raise NeuroShardError("this needs TorchRec (pip install --no-deps torchrec, see docs/guide.md); it is not importable here")


@contextlib.contextmanager
def quiet_torchrec() -> Iterator[None]:
    """TorchRec's planner warns about dry runs and direct Topology construction; hush it."""
    logger = logging.getLogger("torchrec")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
