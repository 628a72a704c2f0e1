"""``neuroshard search`` and ``neuroshard export`` (registered by ``neuroshard.cli``)."""
from __future__ import annotations

import argparse
import json

from ..cli_options import (
    STDOUT,
    add_budget,
    add_comm_precision,
    add_input,
    add_model_option,
    add_output,
    add_quiet,
    add_tier_options,
    add_topology_options,
    help_table,
    progress_mode,
    tier_options,
    write_output,
)
from ..constants import (
    CACHE_ALGORITHMS,
    CALIBRATION_SETS,
    COMPUTE_KERNELS,
    DATA_PARALLEL_CHOICES,
    DEFAULT_DATA_PARALLEL,
    DEFAULT_ROW_BLOCKS,
    MAX_CALIBRATION_SETS,
    MIN_CALIBRATION_SETS,
    OBJECTIVES,
    REFINE_JUDGES,
    ROW_BLOCKS,
)
from ..errors import NeuroShardError
from ..exporters import exporter_names
from ..optimizers import DEFAULT_OPTIMIZER, OPTIMIZERS
from ..topology import memory_list
from ..validate import (
    MAX_DEVICES,
    batch_size_int,
    bytes_per_element_int,
    device_count,
    float_in,
    int_in,
    memory_size,
    optional_count,
    seed_int,
)
from .params import describe_params
from .registry import ALGORITHMS

ALGORITHM_CHOICES = ALGORITHMS  # the registry's names (listing them imports no algorithm)


def _param(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with VALUE read as JSON when it parses (numbers, true/false), else a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    if not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if value.strip() in ("True", "False", "TRUE", "FALSE"):  # Python spelling of JSON's true/false
        return key.strip(), value.strip().lower() == "true"
    try:
        return key.strip(), json.loads(value)
    except (ValueError, RecursionError):
        return key.strip(), value


def _objective_options(args: argparse.Namespace) -> dict:
    """``shard``'s objective keywords from the flags (none for the default objective; a model or
    operator-costs file without ``--objective iteration`` is refused: it would be ignored)."""
    if args.objective == "embedding":
        if args.model is not None or args.operator_costs is not None:
            raise NeuroShardError("--model and --operator-costs price the training iteration: give them with "
                                  "--objective iteration")
        return {}
    from ..cli_options import model_option
    return {"objective": args.objective, "model": model_option(args), "operator_costs": args.operator_costs}


def _judge_option(args: argparse.Namespace) -> dict:
    """``shard``'s ``judge`` from ``--judge`` (none for ``kernel``, refine's own instrument); ``--judge
    runtime`` without ``--refine`` is refused: nothing would be judged."""
    if args.judge == "kernel":
        return {}
    if not args.refine:
        raise NeuroShardError(f"--judge {args.judge} makes refine's final choice: give it with --refine")
    from ..runtime.judge import RuntimeJudge
    return {"judge": RuntimeJudge()}


def _again(entry: dict) -> str:
    """A finalist's later timing runs in refine's record: all runs and the median that chose
    (plans with final_median_cost_ms), or the second run and the mean of two (earlier plans); "" for a plan
    timed once."""
    if "final_median_cost_ms" in entry:
        runs = ", ".join(f"{c:.2f}" for c in entry["final_runs_cost_ms"][1:])
        return f" (again {runs}; each device's median {entry['final_median_cost_ms']:.2f})"
    if "final_mean_cost_ms" in entry:
        return f" (again {entry['final_measured_cost_ms_again']:.2f}, mean {entry['final_mean_cost_ms']:.2f})"
    return ""


def _untimed(entry: dict) -> str:
    """Why a compared plan has no figure in refine's timed run, in words."""
    if "failed" in entry:
        return "no plan"
    if "skipped" in entry:
        return "not timed (budget)"
    return "same plan as above"


def _rebalance_how(p: dict) -> str:
    """What refine's rebalance tried from a plan (one entry of ``provenance.refine.rebalance.plans``),
    in the words of ``measured.refine``'s names, for the printout."""
    if p.get("split"):
        return f" {p['split']} split{' and repacked' if p.get('repacked') else ''},"
    return (" repacked evenly," if p.get("even") else " repacked,") if p.get("repacked") else ""


def _params(pairs: list[tuple[str, object]] | None) -> dict:
    """``--param`` pairs as a dict; a key given twice is refused (the last would silently win)."""
    params: dict = {}
    for key, value in pairs or []:
        if key in params and params[key] != value:
            raise NeuroShardError(f"--param {key} is given twice ({params[key]!r} and {value!r}); give it once")
        params[key] = value
    return params


def _say_refine(say, refine: dict) -> None:
    """What ``search --refine`` prints of ``provenance.refine``: every round, plan, stage and the budget."""
    from ..measured.budget import format_budget
    from ..measured.refine import format_judgement
    if refine:
        say(f"refine: every time below was measured on this machine ({refine.get('hardware') or 'unrecorded'}) at "
            f"batch {refine.get('batch_size', 0):,} (the cost models' measured batch; the estimate above is at the "
            f"tables' batch): compute timed, communication modelled")
    for r in refine.get("rounds", []):
        say(f"refine round {r['round']}: models {100 * r['device_gmae']:.1f}% off on the plan's devices; measured "
            f"max compute {r['measured_max_compute_ms']:.2f} ms (estimated {r['estimated_max_compute_ms']:.2f}), "
            f"measured cost {r['measured_cost_ms']:.2f} ms" if r.get("timed", True) else
            f"refine round {r['round']}: searched against the calibrated models, its devices not timed alone (no "
            f"later round fits the budget)")
    if refine and any("final_measured_cost_ms" in e for e in refine.get("rounds", []) + refine.get("compared", [])):
        finals = [(f"round {r['round']}", r) for r in refine.get("rounds", [])]
        finals += [(c["algorithm"], c) for c in refine.get("compared", [])]
        say("refine, all plans in one timed run: " + "; ".join(
            f"{name} {e['final_measured_cost_ms']:.2f} ms" + _again(e) if "final_measured_cost_ms" in e
            else f"{name} {_untimed(e)}" for name, e in finals)
            + ("" if "judge" in refine else f"; written: {refine['chosen']}'s plan"))
    elif refine:
        say(f"refine: no plans timed together; written: {refine.get('chosen')}'s plan (the plain search's)")
    rebalanced = refine.get("rebalance")
    if rebalanced:
        fit = rebalanced["fit"]
        tried = "; ".join(f"{p['from']}{_rebalance_how(p)} {p['changes']} changes"
                          f"{' (cut)' if 'cut_after' in p else ''}, "
                          f"estimated {p['estimated_cost_before_ms']:.2f} -> {p['estimated_cost_after_ms']:.2f} ms"
                          + (f", measured {p['measured_cost_ms']:.2f} ms" if "measured_cost_ms" in p else "")
                          for p in rebalanced["plans"])
        outcome = ("could not be timed (" + rebalanced["stopped"] + ")" if "stopped" in rebalanced else
                   f"the chosen plan {rebalanced['chosen_measured_cost_ms']:.2f} ms in the same runs" if
                   "chosen_measured_cost_ms" in rebalanced else "nothing to time")
        confirm = rebalanced.get("confirm", {})
        if "measured_cost_ms" in confirm:
            outcome += (f"; {confirm['plan']} timed again in fresh runs: {confirm['measured_cost_ms'][1]:.2f} ms "
                        f"against {confirm['measured_cost_ms'][0]:.2f}, " + ("kept" if confirm["kept"] else "not kept"))
        say(f"refine, rebalanced on marginal costs fitted to {fit['sets']} timed devices ({100 * fit['fit_error']:.1f}% "
            f"off them): {tried}; {outcome}; written: "
            + (f"{rebalanced['kept']}'s plan" if rebalanced["kept"] else "the chosen plan"))
    tie = refine.get("tie")
    if tie:
        allowance = tie.get("work_allowance")  # (absent in some 0.1.0 plans)
        priced = (f", or {tie['cheapest']}'s work beyond {100 * allowance:.0f}% over the least cost it more than its "
                  f"lead" if allowance is not None else "")
        say(f"refine, a tie: {tie['chosen']}'s plan measured within {100 * tie['margin']:.0f}% of {tie['cheapest']}'s "
            f"on the slowest device and did less total compute{priced}: it goes on")
    if "polish" in refine:
        polish = refine["polish"]
        say(f"polish: {polish['accepted']} of {polish['steps']} timed changes kept (a change is kept when two "
            f"timing runs both show it cheaper); the plan's measured cost "
            f"{polish.get('measured_cost_before_ms', float('nan')):.2f} ms when chosen, "
            f"{polish.get('measured_cost_after_ms', float('nan')):.2f} ms in the last run"
            + ("" if polish["accepted"] else " (the same plan: the difference is this machine's drift)")
            + ("; the budget ended it" if polish.get("end") == "budget" else ""))
        check = polish.get("final_check")
        if check and "polished_cost_ms" not in check:
            say(f"polish: the final check was not timed ({check.get('skipped') or check.get('stopped')})"
                + ("; the chosen plan written, unpolished" if "skipped" in check else ""))
        elif check:
            say(f"polish: the polished plan {check['polished_cost_ms']:.2f} ms against {check['started_cost_ms']:.2f} "
                f"for the chosen one, timed together ({check['runs']} runs): "
                + ("polished plan written" if check["kept"] else "the chosen plan written, unpolished"))
    lean = refine.get("lean")
    if lean:
        timed = ("both could not be timed (" + (lean.get("stopped") or lean["skipped"]) + "): the chosen plan written"
                 if "stopped" in lean or "skipped" in lean else
                 f"both polished plans timed together: {lean['measured_cost_ms'][1]:.2f} ms against "
                 f"{lean['measured_cost_ms'][0]:.2f} for the chosen"
                 + (f" (total compute {lean['measured_total_compute_ms'][1]:.1f} against "
                    f"{lean['measured_total_compute_ms'][0]:.1f} ms)" if "measured_total_compute_ms" in lean else "")
                 + ", "
                 + (f"{lean['plan']}'s plan written" if lean["kept"] else "the chosen plan written"))
        say(f"refine, less work first: {lean['plan']}'s plan did {lean['total_compute_ms']:.1f} ms of compute in all "
            f"against {lean['chosen_total_compute_ms']:.1f} for the chosen one; polished too "
            f"({lean['polish']['accepted']} of {lean['polish']['steps']} changes kept); {timed}")
    judged = refine.get("judge")
    if judged:
        say(format_judgement(judged))
    if "wall_s" in refine:
        against = refine.get("against_best_baseline")
        say(format_budget(refine) + (f"; the written plan measured {against['ratio']:.3f}x {against['baseline']}'s "
                                     f"(the best baseline in the runs that chose it)" if against else ""))

def _search(args: argparse.Namespace) -> int:
    from ..measured.api import measured_search
    from ..measured.budget import EXIT_STOPPED, stop_on_sigterm
    from ..tables import TableSet
    from ..validate import check_output
    if args.output != STDOUT:
        check_output(args.output, [args.tables, args.cost_model], "plan file")
    from ..topology import topology_from_options
    tables = TableSet.read(args.tables)
    topology = topology_from_options(args.topology, args.devices, args.local_world_size, args.intra_host_gbps,
                                     args.inter_host_gbps, tier_options(args))
    if args.budget is not None and not args.refine:
        raise NeuroShardError("--budget bounds the measured loop: give it with --refine")
    measured = {"budget_s": args.budget, "progress": progress_mode(args)} if args.refine else {}
    with stop_on_sigterm():  # SIGTERM stops refine as Ctrl-C does: the best plan so far is written
        plan = measured_search(tables, devices=args.devices, memory=args.memory, algorithm=args.algorithm,
                               calibrate=args.calibrate, cost_models=args.cost_model,
                               bytes_per_element=args.bytes_per_element,
                               seed=args.seed, optimizer=args.optimizer, data_parallel=args.data_parallel,
                               comm_precision=args.comm_precision, topology=topology, refine=args.refine,
                               tier_costs=args.tier_costs, row_blocks=args.row_blocks, **_judge_option(args),
                               **_objective_options(args), **measured,
                               **_params(args.param))
    say = write_output(args.output, json.dumps(plan.validate().to_dict(), indent=1) + "\n")
    say(plan.format_summary())
    prov = plan.provenance or {}
    bound = plan.format_bound()
    if bound:
        say(bound)
    checked = prov.get("calibration_check")
    if checked:
        same = [what for key, what in (("pretrained_plan", "the pre-trained models'"),
                                       ("work_plan", "the work model's")) if key in checked]
        same = f"{' and '.join(same)} plan{'s are' if len(same) > 1 else ' is'} the same" if same else ""
        say("calibrate: " + (f"the plans could not be timed ({checked['stopped']}); the calibrated models' plan written"
                             if "stopped" in checked else
                             "the models' plans timed together on this machine: "
                             + ", ".join(f"{n} {ms:.2f} ms" for n, ms in checked["measured_cost_ms"].items())
                             + f"; written: the {checked['written']} plan" + (f" ({same})" if same else "")
                             if "measured_cost_ms" in checked else same))
    refine = prov.get("refine", {})
    _say_refine(say, refine)
    measured_on = prov.get("parameters", {}).get("measured_on")
    if measured_on:
        say(f"{args.algorithm} timed the tables on this machine ({measured_on}): the plan is for this hardware")
    objective = prov.get("objective")
    if objective:
        say(f"objective iteration ({objective['model']['name']}, operators measured on {objective['operators']}): "
            + ", ".join(f"{name} {ms:.3f} ms" for name, ms in objective["predicted_iteration_ms"].items())
            + f" predicted per step; written: {objective['chosen']}'s plan")
        if objective.get("ties"):
            say(f"a tie: {', '.join(objective['ties'])} predicted within {100 * objective['tie_margin']:.0f}% of "
                f"{objective['chosen']}'s step, closer than the model tells apart (docs/decisions.md#iteration-tie-margin); "
                f"to choose, search each (-a NAME) and time them on your machine (neuroshard evaluate PLAN "
                f"--tables T --model M -o OUT.json: iteration_ms)")
    say(f"searched in {prov.get('search_time_s', float('nan')):.2f} s" + (" (the whole measured loop)" if refine
                                                                            else "")
        + f" with cost model '{prov.get('cost_model')}'; wrote {args.output}")
    # stopped by Ctrl-C or SIGTERM: the best plan so far is written, and the status says it was stopped
    return EXIT_STOPPED.get(refine.get("stopped"), 0)


def _export(args: argparse.Namespace) -> int:
    from ..exporters import get_exporter
    from ..plan import Plan
    from ..validate import check_output
    exporter = get_exporter(args.format)
    if args.output != STDOUT:
        check_output(args.output, [args.plan], "export file")
    plan = Plan.read_checked(args.plan)
    exported = exporter.export(plan, compute_device=args.compute_device, compute_kernel=args.compute_kernel,
                               cache_load_factor=args.cache_load_factor, cache_algorithm=args.cache_algorithm,
                               local_world_size=args.local_world_size)
    say = write_output(args.output, json.dumps(exported, indent=1) + "\n")
    say(f"wrote {args.output}: {exporter.describe(plan, exported)}")
    return 0


def _capacity(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..tables import TableSet
    from ..validate import check_output
    from .capacity import describe, plan_capacity
    plan_path = None
    if args.output != STDOUT:
        plan_path = Path(args.output).with_suffix(".tiered-plan.json")
        check_output(args.output, [args.tables, args.cost_model], "capacity report")
        check_output(str(plan_path), [args.tables, args.cost_model], "tiered plan file")
    tables = TableSet.read(args.tables)
    links = {k: v for k, v in tier_options(args).items() if k not in ("host_memory_bytes", "ssd_bytes")}
    report = plan_capacity(tables, args.memory, args.local_world_size, host_memory=args.host_memory, ssd=args.ssd,
                           slowdown=args.slowdown, algorithm=args.algorithm, cost_models=args.cost_model,
                           optimizer=args.optimizer, relative_speed=args.relative_speed, **links)
    out = report.to_dict()
    if plan_path is not None and report.plan is not None:
        out["tiered_plan"] = str(plan_path)
        report.plan.write(plan_path)
    say = write_output(args.output, json.dumps(out, indent=1) + "\n")
    say(describe(report))
    say(f"wrote {args.output}" + (f" and the tiered plan {plan_path}" if plan_path else ""))
    return 0


def _estimate(args: argparse.Namespace) -> int:
    from ..cli_options import model_option
    from ..costmodels import resolve_cost_models
    from ..costmodels.dense import load_operator_models
    from ..costmodels.samples.store import other_cpu
    from ..plan import Plan
    from ..tables import TableSet
    from ..validate import check_output
    from .iteration import estimate_iteration
    if args.output:
        check_output(args.output, [args.plan, args.tables, args.cost_model, args.operator_costs, args.model], "estimate")
    tables = TableSet.read(args.tables)
    plan = Plan.read_checked(args.plan, tables)
    operators = load_operator_models(args.operator_costs)
    models = resolve_cost_models(args.cost_model)
    estimate = estimate_iteration(plan, tables, models, operators, model_option(args), batch_size=args.batch_size)
    print(estimate.format())
    print(f"sources: embeddings by cost model {estimate.sources['embedding']}, measured on "
          f"{models.describe_hardware()}; operators measured on {estimate.sources['operators']}; "
          f"GPU terms {estimate.sources['gpu_terms']}")
    if "shared_cores" in estimate.sources:
        print(f"warning: {estimate.sources['shared_cores']}")
    elsewhere = [f"the {what} were {where}" for what, where in
                 (("operator costs", other_cpu(operators.hardware_)),
                  ("embedding costs", other_cpu((models.hardware or {}).get("hardware") or {}))) if where]
    if elsewhere:  # one warning, naming every term measured elsewhere
        print(f"warning: {' and '.join(elsewhere)}: the estimate describes that hardware; `neuroshard collect "
              f"dense` and `collect overheads` measure this one's operators, `neuroshard pretrain --here` all of it "
              f"(on a newer CPU of the same name the shipped operator file was 33.5% off per step, 7.0% after: "
              f"docs/results.md#iteration-model)")
    if args.output:
        from ..io import atomic_write_text
        atomic_write_text(args.output, json.dumps(estimate.to_dict(), indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this stage's subcommands."""
    p = sub.add_parser("estimate", help="predict one training iteration of a plan, term by term",
                       description="Predict what one training step of a plan takes on the included runtime: per "
                                   "rank, every term (data loading, embedding forward and backward, the two "
                                   "all-to-alls with their waiting, the dense model's forward, backward, "
                                   "all-reduce and optimizer step, the barrier), the iteration time on the "
                                   "critical path and which rank and operators form it. `neuroshard evaluate "
                                   "-o` measures the same terms.")
    add_input(p, "plan", "plan file (neuroshard.plan/v1, JSON; `plan import` reads a TorchRec plan)")
    p.add_argument("--tables", required=True, help="tables file the plan is for (JSON, neuroshard.tables/v1)")
    add_model_option(p, "the dense part being trained")
    p.add_argument("--batch-size", type=batch_size_int, default=None,
                   help="global batch of one step (default: the tables file's)")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="embedding cost-model checkpoint (default: the shipped one)")
    p.add_argument("--operator-costs", default=None, metavar="OPS.json",
                   help="operator cost models of the dense part and overheads (`collect dense`; default: the "
                        "shipped ones, measured on this repository's CPU VM)")
    add_output(p, "JSON to write: {\"iteration_ms\": ..., \"breakdown\": {...}, \"critical_path\": [...]}",
               metavar="OUT.json")
    p.set_defaults(func=_estimate)

    p = sub.add_parser("search", help="search a sharding plan for a tables file",
                       description="Search a sharding plan against the cost models and write a "
                                   "neuroshard.plan/v1 file with its estimate and provenance.")
    add_input(p, "tables", "tables file (JSON, neuroshard.tables/v1)")
    p.add_argument("-d", "--devices", type=device_count, required=True,
                   help=f"number of devices (at most {MAX_DEVICES})")
    p.add_argument("-m", "--memory", type=memory_list, default=None,
                   help="memory per device for embeddings, e.g. 16GiB, 16GB, bytes, or a comma list with one "
                        "size per device (required unless the --topology file gives it)")
    p.add_argument("-a", "--algorithm", choices=ALGORITHM_CHOICES, default="neuroshard",
                   help="search algorithm (default: neuroshard); measured-greedy times every table on this "
                        "machine, so run it on the hardware the plan is for")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="cost-model checkpoint (default: the shipped one)")
    p.add_argument("--calibrate", nargs="?", const=CALIBRATION_SETS, default=0, type=optional_count(int_in(MIN_CALIBRATION_SETS, MAX_CALIBRATION_SETS, "a set count"), "--calibrate"),
                   metavar="SETS", help="first calibrate the cost models on this machine and these tables (as "
                   f"`neuroshard calibrate`, with SETS random sets, {CALIBRATION_SETS} when SETS is left out; a few "
                   "minutes, cached per machine, checkpoint and tables)")
    p.add_argument("--refine", nargs="?", const=True, default=0, type=optional_count(int_in(1, 20, "a round count"), "--refine"),
                   metavar="ROUNDS", help="then refine on this machine (calibrating first, implied): the plain "
                   "search's plan, the baselines' and the calibrated models' timed together, the cheapest rebalanced "
                   "and polished; ROUNDS rounds fine-tune the models on a plan's devices and search again, when the "
                   "budget has room for them (default 2); all within --budget")
    add_budget(p, "with --refine: the measured loop's wall clock, calibration included: seconds or 90s, 5m, 1h "
                  "(none: unbounded; default 300 s up to 8 devices, 300 x devices / 8 above). Stages that do not fit "
                  "are skipped (the plan's provenance.refine says which and why); when it runs out, or on Ctrl-C or "
                  "SIGTERM, the best plan measured so far is written (exit status 130 after Ctrl-C, 143 after "
                  "SIGTERM)")
    add_quiet(p, "with --refine: no progress line (by default one line updated in place on a terminal, plain lines "
                 "in a log)")
    p.add_argument("--judge", choices=REFINE_JUDGES, default="kernel",
                   help="with --refine, who makes the final choice among refine's plans and the baselines': kernel "
                        "(refine's own timing: the fused kernel, device by device, caches flushed) or runtime (the "
                        "plans trained together on the included runtime, one process per device: warm caches, "
                        "backward and all-to-all included) (default: kernel)")
    p.add_argument("--bytes-per-element", type=bytes_per_element_int, default=4,
                   help="bytes per weight: 4 fp32, 2 fp16 (costed at fp16 and trained so by the runtime), 1 int8 "
                        "(memory only, costed as fp32) (default: 4)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=DEFAULT_OPTIMIZER,
                   help="embedding optimizer whose state counts in memory with the weights: none for sgd, rows x 4 "
                        "bytes for rowwise-adagrad, 1x the weights for adagrad, 2x for adam (default: sgd)")
    p.add_argument("--data-parallel", choices=DATA_PARALLEL_CHOICES, default=DEFAULT_DATA_PARALLEL,
                   help="auto: the neuroshard search may replicate small, hot tables on every device (their "
                        "gradients all-reduced) when the cost models find it cheaper; never: shard every table "
                        f"(default: {DEFAULT_DATA_PARALLEL})")
    p.add_argument("--row-blocks", choices=ROW_BLOCKS, default=DEFAULT_ROW_BLOCKS,
                   help="row splits the search may make: torchrec, only the block counts TorchRec runs (one host's "
                        "ranks or all ranks: every plan exports); any, also 2, 4, ... blocks on any devices, for "
                        "plans NeuroShard's runtime trains (the TorchRec exporter refuses them; on this project's "
                        "CPU a hot table's row halves cost its work whole, 8 blocks much more) (default: "
                        f"{DEFAULT_ROW_BLOCKS})")
    add_comm_precision(p)
    add_topology_options(p)
    p.add_argument("--tier-costs", choices=("analytic", "measured"), default="analytic",
                   help="how the traffic of tables kept in host memory or on SSD is costed: analytic, from the "
                        "topology's link and SSD figures, for GPUs (default); measured: the included runtime's "
                        "miss path timed on this machine now (host memory and a memory-mapped file, a few "
                        "seconds), for plans that train on this machine's CPUs")
    p.add_argument("--objective", choices=OBJECTIVES, default="embedding",
                   help="what plans are ranked by: embedding (the slowest device's embedding compute and exchange, "
                        "default) or iteration (the whole training step predicted by `neuroshard estimate`, dense "
                        "part and data loading included: the algorithm's plan and the greedy baselines' are "
                        "priced and the fastest written)")
    add_model_option(p, "the dense part being trained, for --objective iteration")
    p.add_argument("--operator-costs", default=None, metavar="OPS.json",
                   help="operator cost models for --objective iteration (`collect dense`; default: the shipped ones)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.epilog = help_table("--param keys per algorithm (default values):",
                          {name: describe_params(name) for name in ALGORITHMS})
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--param", type=_param, action="append", metavar="KEY=VALUE",
                   help="algorithm parameter, e.g. beam_width=4 (repeatable)")
    add_output(p, "plan file to write (- for standard output)", required=True, metavar="PLAN.json")
    p.set_defaults(func=_search)

    p = sub.add_parser("capacity", help="how many devices with host memory and SSD tiers, against all in device "
                                        "memory",
                       description="Find the fewest devices (whole hosts) whose plan keeps every row in device "
                                   "memory, and the fewest whose tiered plan (rows in host memory or on SSD behind "
                                   "device caches) is estimated within --slowdown of it. No hardware is timed: both "
                                   "are the cost models' estimates, the tiers' traffic modelled from the link "
                                   "figures (analytic).")
    add_input(p, "tables", "tables file (JSON, neuroshard.tables/v1)")
    p.add_argument("-m", "--memory", type=memory_size, required=True, help="memory per device for embeddings")
    p.add_argument("--local-world-size", type=device_count, default=8, metavar="N",
                   help="devices per host: plans use whole hosts (default 8)")
    p.add_argument("--slowdown", type=float_in(1.0, 100.0, what="a factor"), default=1.10,
                   help="the tiered plan may be estimated at most this much slower (default 1.10)")
    p.add_argument("-a", "--algorithm", choices=ALGORITHM_CHOICES, default="neuroshard",
                   help="search algorithm for every plan (default: neuroshard)")
    p.add_argument("--cost-model", default=None, metavar="MODEL.pt",
                   help="cost-model checkpoint (default: the shipped one)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=DEFAULT_OPTIMIZER,
                   help="embedding optimizer whose state counts in memory (default: sgd)")
    p.add_argument("--relative-speed", type=float_in(0.01, 100.0, what="a speed"), default=1.0, metavar="X",
                   help="every device X times as fast as the hardware the cost models measured (default 1; e.g. "
                        "GPUs planned with a CPU-measured model: an assumption the report should state)")
    add_tier_options(p)
    add_output(p, "capacity report to write (JSON; the tiered plan is written beside it as "
                  "NAME.tiered-plan.json)", required=True, metavar="REPORT.json")
    p.set_defaults(func=_capacity)

    p = sub.add_parser("export", help="export a plan for another framework",
                       description="Write what TorchRec needs to apply a plan: per table a ParameterSharding "
                                   "record (sharding type, compute kernel, ranks, shard offsets/sizes/placement). "
                                   "A table laid out in a way TorchRec cannot run exactly is refused, naming it.")
    add_input(p, "plan", "plan file (JSON, neuroshard.plan/v1)")
    p.add_argument("--format", choices=exporter_names(), default="torchrec", help="target (default: torchrec)")
    p.add_argument("--compute-device", choices=("cuda", "cpu"), default="cuda",
                   help="placement device: rank:R/cuda:(R mod local world size), for training on GPUs "
                        "(default: cuda, whatever machine writes the export), or rank:R/cpu for TorchRec's "
                        "DMP on CPU processes")
    p.add_argument("--local-world-size", type=device_count, default=None, metavar="N",
                   help="ranks per host, for cuda device numbers and table-row-wise/grid shards (default: the "
                        "plan's topology's, else TorchRec's: 8, or the world size when it is not a multiple of 8)")
    p.add_argument("--compute-kernel", default="fused", choices=COMPUTE_KERNELS,
                   help="TorchRec compute kernel of the tables in device memory (default: fused); a table the "
                        "plan keeps in host memory or on SSD runs its tier's kernel whatever this says: "
                        "fused_uvm_caching with its cache_fraction as load factor, fused_uvm, or key_value")
    p.add_argument("--cache-load-factor", type=float_in(0.0, 1.0, low_open=True, what="a fraction"), default=None,
                   metavar="F", help="with --compute-kernel fused_uvm_caching: the share of each table's rows its "
                                     "device cache holds (default: TorchRec's 0.2; `neuroshard tables cache` gives "
                                     "the miss rate of each; a plan's cached tables use their cache_fraction)")
    p.add_argument("--cache-algorithm", choices=CACHE_ALGORITHMS, default=None,
                   help="with fused_uvm_caching (the global kernel or a plan's cached host tables): the cache's "
                        "eviction, lru or lfu (default: lru)")
    add_output(p, "file to write (- for standard output)", required=True, metavar="OUT.json")
    p.set_defaults(func=_export)
