"""Score any plan (ours, TorchRec's, hand-made) with the cost models."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..costmodels import resolve_cost_models
from ..plan import Plan
from ..tables import TableSet
from .simulator import Simulator


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
    if tables is None:
        tables = plan_tables(plan, batch_size)
    else:
        plan.check_matches(tables)
        if batch_size:
            tables = tables.at_batch(batch_size)
    plan.validate()
    models = resolve_cost_models(cost_models)
    sim = Simulator.from_plan(plan, models, tables)
    estimate = sim.plan_estimate(sim.evaluate_plan(plan))
    estimate["cost_model"] = models.name
    return replace(plan, estimate=estimate, extra=dict(plan.extra))
