"""The fit and the report of ``neuroshard pretrain --here``.

``fit_models`` runs ``costmodels.pretrain`` on the machine's data and keeps the checkpoint in
the machine's folder; ``family_errors`` gives the held-out error per training family and model
kind (the shipped checkpoint's beside them); ``format_report`` writes ``report.txt``.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..costmodels.base import CostModels
from ..costmodels.dense import OperatorModels
from ..costmodels.loading import DEFAULT_CHECKPOINT, this_machine_name
from ..costmodels.metrics import gmae
from ..costmodels.pretrain import ComputeData, PretrainResult, format_table, parity_plot, pretrain
from ..costmodels.samples import store
from ..costmodels.samples.kernel import llc_bytes
from ..errors import NeuroShardError
from .machine_profiles import HELD_OUT_FAMILIES, MIXED, TRAINING_FAMILIES, family_of

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------- fit
def fit_models(compute_folders: Sequence[Path], comm_folders: Sequence[Path], folder: Path, fingerprint: dict, *,
               epochs: int, ensemble: int, test_tables: float, tune: int, seed: int) -> tuple[CostModels, dict]:
    """``costmodels.pretrain`` on the machine's data; the bundle named and marked as this
    machine's, saved with its parity plot; and what the report needs (held-out errors per
    family and model kind, the shipped checkpoint's on the same sets)."""
    # the set-level head: crowding and the working set beyond this machine's cache, rows capped as measured
    row_cap = max(int((store.read_meta(f) or {}).get("config", {}).get("max_rows", 0)) for f in compute_folders)
    head = (llc_bytes(), row_cap) if ensemble and row_cap else None
    result = pretrain(compute_folders, comm_folders, out=None, tune=tune, epochs=epochs, test_tables=test_tables,
                      seed=seed, refit=True, ensemble=ensemble, set_head=head)
    models = result.models
    models.name = f"pretrained-here-{folder.name[:8]}"
    models.hardware = {**(models.hardware or {}), "machine": {"id": folder.name, "fingerprint": fingerprint,
                                                              "command": "neuroshard pretrain --here"}}
    models.save(folder / store.MACHINE_MODEL_FILE)
    parity_plot(folder / "model.parity.png", result.compute_models, result.compute_test, result.comm_models,
                result.comm_test)
    record = {"summary": models.data_summary.get("compute", {}),
              "comm_summary": models.data_summary.get("comm", {}),
              "families": family_errors(result),
              "table": format_table(result.table),
              "fitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return models, record


def family_errors(result: PretrainResult) -> list[dict]:
    """Held-out GMAE of each compute model kind (and of the shipped checkpoint, measured on
    another machine) per family of the held-out sets' tables (``mixed``: tables of several), and
    over all of them."""
    test = result.compute_test
    if test is None or len(test) == 0:
        return []
    models: dict[str, Any] = dict(result.compute_models)
    shipped = _shipped_compute(test.batch_size)
    if shipped is not None:
        models["shipped (another machine)"] = shipped
    families = np.array([_set_family(t) for t in test.tables])
    rows = []
    for family in [*TRAINING_FAMILIES, MIXED, "all"]:
        rows_of = np.arange(len(test)) if family == "all" else np.flatnonzero(families == family)
        if len(rows_of) == 0:
            continue
        subset = test.subset(rows_of)
        row = {"family": family, "sets": int(len(rows_of))}
        for name, model in models.items():
            row[name] = _gmae(model, subset)
        rows.append(row)
    return rows


def _set_family(tables: frozenset) -> str:
    families = {family_of(name) for name in tables}
    return families.pop() if len(families) == 1 else MIXED


def _gmae(model: Any, data: ComputeData) -> float:
    return gmae(np.asarray(model.predict(data.sets), dtype=np.float64), data.costs_ms)


def _shipped_compute(batch_size: int):
    """The shipped checkpoint's compute model when it was measured at ``batch_size`` (None otherwise)."""
    if not DEFAULT_CHECKPOINT.exists():
        return None
    try:
        shipped = CostModels.load(DEFAULT_CHECKPOINT)
    except NeuroShardError as exc:
        log.warning("the shipped checkpoint is not compared: %s", exc)
        return None
    return shipped.compute if shipped.batch_size == batch_size else None


# -------------------------------------------------------------------- report
def format_report(state: dict, folder: Path, operators: OperatorModels) -> str:
    """``report.txt``: the machine, what was measured, the held-out errors per family and model
    kind, the operators' errors and overheads, and each stage's time."""
    fingerprint = state.get("fingerprint") or {}
    fit = state.get("fit") or {}
    summary = fit.get("summary") or {}
    lines = [f"neuroshard pretrain --here: the cost models of {this_machine_name(folder.name)}",
             f"machine: {store.describe_fingerprint(fingerprint)}",
             f"folder: {folder}",
             f"training families (collected): {', '.join(TRAINING_FAMILIES)}; held out (never collected: the "
             f"benchmark that judges the model uses them): {', '.join(HELD_OUT_FAMILIES)} (the operator benchmark "
             f"times a rank's data loading on its own mix of tables, these among them)", ""]
    if summary:
        low, high = summary.get("cost_ms_range", [0.0, 0.0])
        lines.append(f"compute: {summary.get('shard_sets')} shard sets over {summary.get('source_tables')} tables "
                     f"({summary.get('shards_per_set_mean', 0):.1f} shards a set on average, "
                     f"{low:.2f}-{high:.1f} ms); "
                     f"held out: {summary.get('test_sets')} sets, split {summary.get('split')}")
    head = summary.get("set_head") or {}
    if "gmae_with" in head:
        lines.append(f"set-level head (crowding, working set beyond the cache): held-out GMAE "
                     f"{100 * head['gmae_without']:.1f}% without, {100 * head['gmae_with']:.1f}% with "
                     f"({head['held_out_sets']} sets; {head['crowded_sets']} of 16+ shards: "
                     f"{100 * head['crowded_gmae_without']:.1f}% -> {100 * head['crowded_gmae_with']:.1f}%); "
                     f"{'kept' if head['kept'] else 'not kept'}")
    elif head:
        lines.append(f"set-level head: not kept ({head.get('why', 'no held-out sets')})")
    comm = fit.get("comm_summary") or {}
    if comm.get("samples"):
        lines.append("exchange: " + ", ".join(f"{n} samples at {d} devices" for d, n in comm["samples"].items()))
    families = fit.get("families") or []
    if families:
        kinds = [k for k in families[0] if k not in ("family", "sets")]
        lines += ["", "held-out GMAE per family and model kind (compute; the neural row is one member's recipe; "
                      "the shipped checkpoint was measured on another machine):",
                  f"  {'family':12s} {'sets':>5s}  " + "  ".join(f"{k:>12s}" for k in kinds)]
        for row in families:
            lines.append(f"  {row['family']:12s} {row['sets']:5d}  "
                         + "  ".join(f"{100 * row[k]:11.1f}%" for k in kinds))
    if fit.get("table"):
        lines += ["", "held-out metrics of every model (pretrain's table):", fit["table"]]
    lines += ["", "operator costs (the iteration model's):", operators.format_metrics()]
    if operators.overheads_:
        lines.append(f"  overheads of {len({p.get('run') for p in operators.overhead_points_})} real runs "
                     f"(measured = fixed + scale x predicted, per term and processes):")
        for term, per in operators.overheads_.items():
            lines.append(f"    {term:20s} " + "  ".join(f"{r} processes: +{a:.3f} ms, x{b:.2f}"
                                                       for r, (a, b) in sorted(per.items())))
    else:
        lines.append("  no overheads of real runs")
    last = state.get("last_run") or {}
    if last:
        lines += ["", f"last run: {last.get('wall_s', 0) / 60:.1f} minutes of a {last.get('minutes')}-minute budget; "
                      + ", ".join(f"{k} {v:.0f} s" for k, v in (last.get("seconds") or {}).items())
                      + (f"; up to date, not run again: {', '.join(last['skipped'])}" if last.get("skipped") else "")
                      + ("; pace (wall clock over CPU time of a loop: 1 on an idle machine) "
                         + ", ".join(f"{k} {v:.1f}" for k, v in last["pace"].items()) if last.get("pace") else "")]
    spent = state.get("spent_s") or {}
    if spent:
        lines.append("seconds spent in all runs: " + ", ".join(f"{k} {v:.0f}" for k, v in spent.items()))
    return "\n".join(lines) + "\n"
