"""Score any plan (ours, TorchRec's, hand-made) with the cost models, and read a plan
from any file the toolkit knows (``neuroshard.plan/v1`` or a TorchRec plan)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import FormatError
from ..plan import PLAN_FORMAT, Plan
from ..tables import TableSet


def plan_batch_size(plan: Plan) -> int | None:
    """The batch size the plan's estimate is for (``estimate.batch_size``), None when the
    plan does not say (plans written before it was recorded, imported plans)."""
    value = (plan.estimate or {}).get("batch_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def plan_tables(plan: Plan, batch_size: int | None = None) -> TableSet:
    """The plan's own tables as a TableSet at ``batch_size``, else at the batch size of the
    plan's estimate, else the tables file default."""
    size = batch_size or plan_batch_size(plan)
    return TableSet(plan.tables_name, list(plan.tables), **({"batch_size": size} if size else {}))


def score_plan(plan: Plan, tables: TableSet | None = None, cost_models: Any = None,
               batch_size: int | None = None) -> Plan:
    """A copy of ``plan`` with a fresh ``estimate`` from ``cost_models`` (a bundle, a
    checkpoint path, or None for the shipped one), at the batch size of ``tables`` when
    given (the tables file the plan is for), else ``batch_size``, else the batch size of
    the plan's own estimate: re-scoring a searched plan reproduces its estimate."""
    from .api import resolve_cost_models
    from .simulator import Simulator
    if tables is None:
        tables = plan_tables(plan, batch_size)
    else:
        plan.check_matches(tables)
        if batch_size:
            tables = TableSet(tables.name, list(tables), batch_size, tables.extra)
    plan.validate()
    models = resolve_cost_models(cost_models)
    sim = Simulator(tables, plan.num_devices, models, plan.bytes_per_element, optimizer=plan.optimizer,
                    comm_precision=plan.comm_precision, topology=plan.topology)
    estimate = sim.evaluate_plan(plan).to_dict()
    estimate["batch_size"] = tables.batch_size
    bound = sim.balanced_bound_ms()
    estimate["balanced_bound_ms"] = round(bound, 6)
    estimate["ratio_to_balanced_bound"] = round(estimate["max_device_cost_ms"] / bound, 4) if bound > 0 else None
    estimate["cost_model"] = models.name
    return replace(plan, estimate=estimate, extra=dict(plan.extra))


def read_document(path: str | Path, what: str = "plan file") -> Any:
    """A JSON file's content; FormatError (one line, naming the file) when unreadable."""
    from ..validate import read_json
    return read_json(path, what)


def read_any_plan(path: str | Path, tables: TableSet | None = None, memory_bytes: int | None = None) -> Plan:
    """A ``neuroshard.plan/v1`` file, or a TorchRec plan (our export, or ParameterSharding
    records as JSON) converted for ``tables``."""
    data = read_document(path)
    if isinstance(data, dict) and data.get("format") == PLAN_FORMAT:
        return Plan.from_dict(data, source=str(path))
    if tables is None:
        raise FormatError(f"{path}: not a {PLAN_FORMAT} file; a TorchRec plan needs --tables "
                          f"(or convert it first with `neuroshard plan import`)")
    from .torchrec_import import plan_from_torchrec
    return plan_from_torchrec(data, tables, memory_bytes=memory_bytes, where=str(path),
                              provenance={"source": str(path)})
