"""A plan's provenance: where it came from, as a typed record.

The plan file's ``provenance`` object (``docs/formats.md``) is this record's
JSON form: the fields below, written in this order and only when set, then any other key
a plan carried (``extra``: kept as read, so plans of other tools and older versions
read and write back unchanged). The record is also a mutable mapping over that JSON form
(``provenance["algorithm"]``, ``.get``, ``in``), so code that reads plan files as JSON
and code that holds a ``Plan`` say the same thing.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Mapping

from .errors import FormatError


@dataclass(eq=False)
class Provenance(MutableMapping):
    """How a plan was made (every field optional; ``None``: not recorded)."""

    algorithm: str | None = None              # the search algorithm, or e.g. "torchrec-import"
    parameters: dict | None = None            # the algorithm's parameters
    cost_model: str | None = None             # the cost models' name
    cost_model_batch_size: int | None = None  # the batch their data was measured at
    cost_model_hardware: str | None = None    # where their data was measured, in words
    created: str | None = None                # ISO time, UTC
    search_time_s: float | None = None
    cost_model_path: str | None = None
    neuroshard_version: str | None = None
    row_blocks: str | None = None             # "any": row splits TorchRec does not run allowed
    risk: float | None = None                 # an ensemble's risk factor the search charged
    cost_precision: str | None = None         # the precision the estimate's compute is for
    cost_precision_scaling: dict | None = None  # the measured ratio that carried it there
    cost_optimizer: str | None = None         # the optimizer the kernels were timed with
    topology: str | None = None               # the cluster, in words
    data_parallel: dict | None = None         # what data_parallel="auto" replicated, and why
    tiers: dict | None = None                 # memory tiers chosen and how they were costed
    comm_model: str | None = None             # which model costed the all-to-all, in words
    objective: dict | None = None             # objective "iteration": every candidate's predicted step, ties
    fallback: dict | None = None              # the search could not pack: a baseline's plan, and why
    splits: dict | None = None                # why each split table was split (memory, constraints, balance, cost)
    calibration_check: dict | None = None     # search --calibrate: the models' plans measured
    refine: dict | None = None                # the measured loop that chose the plan
    source: str | None = None                 # an imported plan's file
    format: str | None = None                 # an imported plan's format
    extra: dict = field(default_factory=dict)  # any other key, as read

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, where: str = "plan") -> "Provenance":
        """The record of a plan file's ``provenance`` object (unknown keys kept in ``extra``)."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise FormatError(f"{where}: field 'provenance' must be an object")
        out = cls()
        for key, value in data.items():
            out[key] = value
        return out

    def to_dict(self) -> dict:
        """The JSON form: the set fields in declaration order, then ``extra``."""
        return dict(self.items())

    # ---------------------------------------------------- the mapping view
    def _known(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if f.name != "extra")

    def __getitem__(self, key: str) -> Any:
        if key in self._known():
            value = getattr(self, key)
            if value is None:
                raise KeyError(key)
            return value
        return self.extra[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self._known():
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self._known():
            if getattr(self, key) is None:
                raise KeyError(key)
            setattr(self, key, None)
        else:
            del self.extra[key]

    def __iter__(self) -> Iterator[str]:
        yield from (k for k in self._known() if getattr(self, k) is not None)
        yield from self.extra

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"Provenance({self.to_dict()!r})"
