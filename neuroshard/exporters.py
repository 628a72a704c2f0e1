"""Exporters: a plan written in another framework's form, behind one interface.

An exporter is an ``Exporter`` with a ``name`` (``neuroshard export --format NAME``), the
``format`` string of the document it writes, and ``export(plan, **options) -> dict`` (a
JSON document; a layout the target cannot run exactly is refused with a one-line
``NeuroShardError`` naming the table, never exported wrong). The registry names exporters
by ``"module:attribute"``, imported on first use, so exporters of higher layers (the
``torchrec`` package) register here without this module importing them.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from .errors import NeuroShardError
from .plan import Plan


class Exporter(ABC):
    """Turns a validated plan into a document another framework applies."""

    #: the name ``neuroshard export --format`` takes
    name: ClassVar[str] = ""
    #: the ``format`` string of the documents it writes
    format: ClassVar[str] = ""

    @abstractmethod
    def export(self, plan: Plan, **options: Any) -> dict:
        """The document for ``plan`` (``options``: the exporter's own, e.g. the compute device)."""

    def describe(self, plan: Plan, document: dict) -> str:
        """One line saying what was written (the CLI prints it)."""
        return f"{len(plan.tables)} tables as {self.format}"


_REGISTRY: dict[str, "str | Exporter"] = {
    "torchrec": "neuroshard.torchrec.export:EXPORTER",
}


def register_exporter(exporter: Exporter) -> Exporter:
    """Add ``exporter`` under its ``name`` (refused when the name is taken)."""
    if not isinstance(exporter, Exporter) or not exporter.name:
        raise NeuroShardError(f"an exporter must be an Exporter with a name, got {exporter!r}")
    if exporter.name in _REGISTRY:
        raise NeuroShardError(f"exporter {exporter.name!r} is already registered")
    _REGISTRY[exporter.name] = exporter
    return exporter


def exporter_names() -> tuple[str, ...]:
    """Every registered exporter's name."""
    return tuple(_REGISTRY)


def get_exporter(name: str) -> Exporter:
    """The exporter registered as ``name`` (one-line NeuroShardError naming the choices otherwise)."""
    if name not in _REGISTRY:
        raise NeuroShardError(f"unknown export format {name!r} (choose from {', '.join(_REGISTRY)})")
    entry = _REGISTRY[name]
    if isinstance(entry, str):
        module, attribute = entry.split(":")
        entry = _REGISTRY[name] = getattr(importlib.import_module(module), attribute)
    return entry
