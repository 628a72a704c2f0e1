"""Every search algorithm behind one interface, and the one registry of them.

An algorithm is an object with a ``name``, a ``params_type`` (the dataclass of its
parameters, None when it takes none) and ``search(sim, memory_bytes, params, seed)``
returning a ``Placement`` (as optuna's samplers share one base class). ``search_plan()``,
``neuroshard search --algorithm``, the demo and the experiments all read ``ALGORITHMS``
from here. Entries name ``"module:attribute"`` and are imported on first use, so
listing the algorithms imports none of them (optuna, TorchRec, kernels).

Add an algorithm: ``register(SearchFunction(name, ParamsDataclass, search), **traits)``
from your own code, or, in this package, a module with ``ALGORITHM = SearchFunction(...)``
(as ``bayes``) and one line in ``_REGISTRY`` (docs/extending.md).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import NeuroShardError

if TYPE_CHECKING:
    from ..types import Placement
    from .simulator import Simulator


class SearchAlgorithm(Protocol):
    """What every search algorithm provides."""

    name: str
    params_type: type | None  # dataclass of the algorithm's parameters; None: it takes none

    def search(self, sim: "Simulator", memory_bytes: int, params: Any, seed: int) -> "Placement":
        """The placement found for ``sim``'s tables in ``memory_bytes`` per device (``params``:
        an instance of ``params_type`` or None; ``seed``: the user's seed)."""


@dataclass(frozen=True)
class SearchFunction:
    """An algorithm that is one function ``search(sim, memory_bytes, params, seed)``."""

    name: str
    params_type: type | None
    function: Callable[..., "Placement"]

    def search(self, sim: "Simulator", memory_bytes: int, params: Any, seed: int) -> "Placement":
        return self.function(sim, memory_bytes, params, seed)


@dataclass(frozen=True)
class Registered:
    """A registry entry: where the algorithm object lives and its traits. Every list of
    algorithms elsewhere (the greedy baselines, what refine can correct, what may replicate
    tables, what plan-shaped pre-training sets are drawn from, what refine compares its
    plan with) is derived from these traits, never written out again."""

    target: "str | SearchAlgorithm"  # the algorithm object, or "module:attribute" imported on first use
    greedy_baseline: bool = False  # one of the classic greedy heuristics (fallback, seeds, comparisons)
    needs_hardware: bool = False   # times real kernels on this machine instead of predicting
    model_guided: bool = False     # chooses by the cost models' predictions: the measured loop can correct it
    replicates: bool = False       # may replicate tables on every device (``data_parallel="auto"``)
    plan_sets: bool = False        # its plans' devices are drawn as pre-training sets (``measured.plan_sets``)
    refine_compares: int = 0       # its plan joins refine's final measured comparison, in this order (0: not)


# Targets are strings, imported on first use: listing the algorithms imports none of them,
# and algorithms of the layers above search (the measured loop's measured-greedy, the
# torchrec package's planner) register here without search importing them.
_REGISTRY: dict[str, Registered] = {
    "neuroshard": Registered("neuroshard.search.neuroshard:ALGORITHM", model_guided=True, replicates=True,
                             plan_sets=True),
    "random": Registered("neuroshard.search.baselines:RANDOM", greedy_baseline=True, plan_sets=True),
    "size": Registered("neuroshard.search.baselines:SIZE", greedy_baseline=True, plan_sets=True, refine_compares=4),
    "dim": Registered("neuroshard.search.baselines:DIM", greedy_baseline=True, plan_sets=True, refine_compares=5),
    "lookup": Registered("neuroshard.search.baselines:LOOKUP", greedy_baseline=True, plan_sets=True,
                         refine_compares=3),
    "size-lookup": Registered("neuroshard.search.baselines:SIZE_LOOKUP", greedy_baseline=True, plan_sets=True,
                              refine_compares=2),
    "measured-greedy": Registered("neuroshard.measured.greedy:ALGORITHM", needs_hardware=True, refine_compares=1),
    "bayes": Registered("neuroshard.search.bayes:ALGORITHM", model_guided=True),
    "torchrec": Registered("neuroshard.torchrec.baseline:ALGORITHM"),
}


def with_trait(trait: str) -> tuple[str, ...]:
    """The names of the algorithms with ``trait`` (a field of ``Registered``), in registry order,
    or in the trait's order where it is a rank (``refine_compares``)."""
    having = [n for n, r in _REGISTRY.items() if getattr(r, trait)]
    return tuple(sorted(having, key=lambda n: getattr(_REGISTRY[n], trait)))


def get_trait(name: str, trait: str) -> bool:
    """Whether algorithm ``name`` has ``trait`` (False for a name not registered)."""
    return name in _REGISTRY and bool(getattr(_REGISTRY[name], trait))


ALGORITHMS: tuple[str, ...] = tuple(_REGISTRY)
"""Every algorithm's name, in the order tables and choices list them."""
GREEDY_ALGORITHMS: tuple[str, ...] = with_trait("greedy_baseline")
"""The classic greedy baselines."""
SIMULATED_ALGORITHMS: tuple[str, ...] = tuple(n for n, r in _REGISTRY.items() if not r.needs_hardware)
"""The algorithms that need only the cost models (no kernel timing on this machine)."""
MODEL_GUIDED_ALGORITHMS: tuple[str, ...] = with_trait("model_guided")
"""The algorithms that choose by the cost models: what calibration and refine can correct."""
REPLICATING_ALGORITHMS: tuple[str, ...] = with_trait("replicates")
"""The algorithms that may replicate tables (``data_parallel="auto"``)."""


def get_algorithm(name: str) -> SearchAlgorithm:
    """The algorithm registered as ``name`` (NeuroShardError naming the choices otherwise)."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise NeuroShardError(f"unknown algorithm {name!r} (choose from {', '.join(ALGORITHMS)})")
    target = _REGISTRY[name].target
    if not isinstance(target, str):
        return target
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)


def register(algorithm: SearchAlgorithm, **traits: Any) -> None:
    """Add ``algorithm`` (an object with ``name``, ``params_type`` and ``search``, e.g. a
    ``SearchFunction``) under its name, with ``traits`` (``Registered``'s fields). It is
    then searchable by ``search_plan(algorithm=name)``; choice lists built before (``ALGORITHMS``,
    a CLI parser) do not show it."""
    name = getattr(algorithm, "name", None)
    if not isinstance(name, str) or not name or not callable(getattr(algorithm, "search", None)):
        raise NeuroShardError(f"an algorithm needs a name and a search method, got {algorithm!r}")
    if name in _REGISTRY:
        raise NeuroShardError(f"algorithm {name!r} is already registered")
    _REGISTRY[name] = Registered(algorithm, **traits)


def make_params(algorithm: SearchAlgorithm, params: dict[str, Any]) -> Any:
    """``params`` as the algorithm's parameters dataclass; one-line NeuroShardError for names
    it does not know (or for any parameter when it takes none)."""
    cls = algorithm.params_type
    if cls is None:
        if params:
            raise NeuroShardError(f"algorithm '{algorithm.name}' takes no parameters, got {', '.join(sorted(params))}")
        return None
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise NeuroShardError(f"unknown parameter(s) {', '.join(unknown)} for algorithm '{algorithm.name}' "
                              f"(known: {', '.join(sorted(known))})")
    return cls(**params)
