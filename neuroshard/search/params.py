"""Every registered algorithm's parameters (``--param KEY=VALUE``, ``search_plan(**params)``):
one dataclass each, kept here, apart from the algorithms, so that ``search --help`` can
list the keys and defaults without importing any search (``PARAMS``).

``SearchAlgorithm.params_type`` of each algorithm is its class here
(``tests/test_search_algorithms.py`` checks that ``PARAMS`` says the same).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..constants import DEFAULT_MAX_ROWS
from ..errors import NeuroShardError
from ..validate import check_int, check_number


@dataclass
class NeuroShardParams:
    """Search parameters (the paper's k, L, n and the width-cap grid)."""

    beam_width: int = 3          # k: states kept per step
    depth: int = 8               # L: most splits added to the initial state
    top_n: int = 3               # candidate pieces per state: top-n by size, top-n by cost
    grid_size: int = 8           # width caps tried by the greedy placement
    max_cap_factor: float = 1.5  # caps from 1x to this x the mean width per device (plus no cap)
    row_splits: bool = True      # also try splitting hot tables along rows
    patience: int = 3            # stop after this many steps without a better plan
    local_search_steps: int = 48       # most single-piece moves or swaps off the slowest device at the end
    local_search_swaps: int = 64       # swaps simulated per local-search step (0: moves only)
    baseline_seeds: bool = True  # also start the local search from the best classic greedy plan when cheaper
    split_margin: float = 0.05   # keep the beam's extra splits only when simulated cheaper by more than this
    #                              (negative: a split plan even when simulated up to that much dearer; -1: always)
    large_task: int = 2**18      # pieces x devices from which the heaviest tables are split up front, no beam (0: never)

    def __post_init__(self) -> None:
        for name, low, high in (("beam_width", 1, 64), ("top_n", 1, 64), ("grid_size", 1, 64), ("patience", 1, 1000),
                                ("depth", 0, 1000), ("local_search_steps", 0, 10000),
                                ("local_search_swaps", 0, 100000), ("large_task", 0, 2**62)):
            check_int(getattr(self, name), f"parameter {name}", low, high)
        check_number(self.max_cap_factor, "parameter max_cap_factor", 1.0, 100.0)
        check_number(self.split_margin, "parameter split_margin", -1.0, 1.0)
        for name in ("row_splits", "baseline_seeds"):
            if not isinstance(getattr(self, name), bool):
                raise NeuroShardError(f"parameter {name} must be true or false, got {getattr(self, name)!r}")


@dataclass
class MeasuredGreedyParams:
    """``passes``: timed passes per unit (the run's figure counts, ``timing.device_time``; after one untimed warm-up run),
    ``repeats``: runs per unit and pass; ``batch_size``: batch each unit is timed at
    (None: the cost models'); ``row_cap``, ``kernel``: as ``neuroshard measure``."""

    passes: int = 1
    repeats: int = 1
    batch_size: int | None = None
    row_cap: int = DEFAULT_MAX_ROWS
    kernel: str = "auto"


@dataclass
class BayesParams:
    n_trials: int = 48           # trials in all
    batch: int = 8               # trials scored per simulator call
    max_tables: int = 8          # tables whose splits are searched (highest predicted cost first)
    max_col_halvings: int = 3    # column halvings per table at most
    max_row_parts: int = 4       # row ranges per table at most (1 = no row split)
    max_cap_factor: float = 2.0  # width cap per device, x the mean width

    def __post_init__(self) -> None:
        for name, low, high in (("n_trials", 1, 100000), ("batch", 1, 1024), ("max_tables", 1, 10000),
                                ("max_row_parts", 1, 1024), ("max_col_halvings", 0, 12)):
            check_int(getattr(self, name), f"parameter {name}", low, high)
        check_number(self.max_cap_factor, "parameter max_cap_factor", 1.0, 100.0)


@dataclass
class TorchRecParams:
    """``compute_device``: the device kind TorchRec's planner plans for (``cuda``, the
    default: the devices our plans describe, each with ``memory`` of HBM; or ``cpu``, where
    TorchRec's sharder offers no row-wise layouts, so a table larger than a device has no plan).
    ``timeout_s``: seconds TorchRec's planner proposes at most (its ``timeout_seconds``, whole
    seconds; 0: no limit); at the limit it keeps its best plan so far and says so in one warning."""

    compute_device: str = "cuda"
    timeout_s: float = 120.0


#: algorithm name -> its parameters' dataclass (the algorithms without parameters are absent)
PARAMS: dict[str, type] = {"neuroshard": NeuroShardParams, "measured-greedy": MeasuredGreedyParams,
                           "bayes": BayesParams, "torchrec": TorchRecParams}


def describe_params(name: str) -> str:
    """``key=default, ...`` of algorithm ``name``'s parameters, or ``(none)``."""
    cls = PARAMS.get(name)
    return ", ".join(f"{f.name}={f.default!r}" for f in fields(cls)) if cls else "(none)"


__all__ = ["PARAMS", "describe_params", "NeuroShardParams", "MeasuredGreedyParams", "BayesParams", "TorchRecParams"]
