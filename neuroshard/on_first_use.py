"""Package attributes loaded on first use (PEP 562), so that importing a package, and
building the command line's parser, does not import every heavy library below it.

A package's ``__init__`` lists what it hands out and from which of its submodules::

    _ON_FIRST_USE = {"load_cost_models": "loading", "CostModels": "base"}
    __getattr__, __dir__ = on_first_use(__name__, _ON_FIRST_USE)

``from package import name`` and ``package.name`` then import the submodule the first
time. ``tests/test_layers.py`` reads ``_ON_FIRST_USE`` as the package's imports, so the
layering and circle checks see these edges too.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def on_first_use(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` handing out ``table``'s names (name ->
    submodule, relative to the package) from their submodules, each imported on first use
    and then cached in the package."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        namespace[name] = value  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


__all__ = ["on_first_use"]
