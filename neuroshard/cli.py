"""The one command, ``neuroshard``: a subcommand per stage.

Each stage registers its own subcommands (``register(subparsers)`` in
``neuroshard/<stage>/cli.py``); those modules import heavy libraries lazily so
``--help`` stays fast. Errors a user can fix print as one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import io
import logging
import os
import sys

from . import __version__
from .cli_options import add_budget, add_input, add_output, add_quiet, add_verbose, missing_input
from .constants import MAX_CALIBRATION_SETS
from .errors import NeuroShardError, os_reason
from .execution.launch import torchrun_env
from .validate import device_count, int_in, positive_int, seed_int

STAGE_CLIS = (
    "neuroshard.datasets.cli",
    "neuroshard.costmodels.samples.cli",
    "neuroshard.costmodels.cli",
    "neuroshard.search.cli",
    "neuroshard.runtime.cli",
)


def _plan_validate(args: argparse.Namespace) -> int:
    from .plan import Plan
    plan = Plan.read(args.plan)
    problems = plan.problems()
    if problems:
        for p in problems:
            print(f"{args.plan}: {p}", file=sys.stderr)
        return EXIT_INVALID
    used = max(plan.memory_used_bytes())
    print(f"{args.plan}: valid plan, {len(plan.tables)} tables, {len(plan.shards)} shards on "
          f"{plan.num_devices} devices (fullest device {100.0 * used / plan.device_memory_bytes:.1f}% of memory)")
    return 0


def _plan_show(args: argparse.Namespace) -> int:
    from .plan import Plan
    from .plan_cli import check_plot, plot_plan, show_torchrec_export
    if args.plot:  # a bad name is refused before any work
        check_plot(args.plot, args.plan)
    if show_torchrec_export(args.plan):
        if args.plot:
            raise NeuroShardError(f"{args.plan}: --plot draws a plan file; import this one first (neuroshard plan "
                                  f"import)")
        return 0
    plan = Plan.read(args.plan)
    problems = plan.problems()
    if plan.is_placed():  # an invalid plan is still shown where its devices can be (a row missing, a device full)
        print(plan.format_summary())
        bound = plan.format_bound()
        if bound:
            print(bound)
        print(plan.format_shards())
        splits = plan.format_splits()
        if splits:
            print(splits)
        if args.plot:
            print(f"wrote {plot_plan(plan, args.plot)}")
    if problems:  # shown (a reader may want to see what is wrong), then said on stderr: checked, invalid
        for p in problems:
            print(f"{args.plan}: plan is invalid: {p}", file=sys.stderr)
        return EXIT_INVALID
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(args)


#: exit status of ``plan validate`` and ``plan show`` for a plan they read and found invalid (its
#: problems on standard error); bad input, failed work and usage errors exit 2
EXIT_INVALID = 1
#: exit status after standard output was closed by its reader, or closed before the start and
#: written to (128 + SIGPIPE, as a shell reports a Unix tool ended by the signal); nothing is printed,
#: and the files the command writes are written
EXIT_BROKEN_PIPE = 141


def _silence_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush at exit does
    not hit the closed pipe again (and print "Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout replaced by an object without a descriptor (tests)
        pass


class ClosedStream(io.TextIOBase):
    """Stands for a standard stream the caller closed (``>&-``): what is written to it is dropped
    and remembered (``lost``), so the work goes on and the exit status can say output was lost."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.lost = self.lost or bool(text)
        return len(text)


def guard_streams() -> None:
    """Make closed standard streams safe before any work: a closed descriptor 0-2 is pointed at
    /dev/null (a file opened later would otherwise take its number, and a child process would
    write into it), a missing ``sys.stdout``/``sys.stderr`` becomes a ``ClosedStream``, and
    text that the stream's encoding cannot carry (``PYTHONIOENCODING=ascii`` and a non-ASCII
    table name) is written escaped instead of failing."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = ClosedStream()
    if sys.stderr is None:
        sys.stderr = ClosedStream()
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError, io.UnsupportedOperation):
                pass


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (no usage block), exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="neuroshard",
                           description="Shard DLRM embedding tables with pre-trained neural cost models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for module in STAGE_CLIS:
        importlib.import_module(module).register(sub)

    plan = sub.add_parser("plan", help="inspect, import and score plan files",
                          description="Inspect, import (from TorchRec) and score neuroshard.plan/v1 files.")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    p = plan_sub.add_parser("validate", help="check tiling and memory of a plan", description=
                            "Check that the shards tile every table exactly once and fit every device.")
    add_input(p, "plan", "plan file (JSON)")
    p.set_defaults(func=_plan_validate)
    p = plan_sub.add_parser("show", help="print the per-device table of a plan",
                            description="Print per device its memory, shards, width, lookups and estimated cost "
                                        "(compute and communication apart), what the estimate is for, and which "
                                        "tables (rows, columns) it holds.")
    add_input(p, "plan", "plan file (JSON; a TorchRec export is shown per rank)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="also draw per device the estimated compute and exchange (ms, the tables named on the "
                        "bars where they fit) and the memory by tier, as a PNG")
    p.set_defaults(func=_plan_show)
    from .plan_cli import register as register_plan_io  # plan import, plan score
    register_plan_io(plan_sub)

    from .runtime.compare_cli import register as register_compare  # compare: our plan against TorchRec's, timed here
    register_compare(sub)

    p = sub.add_parser("demo", help="run a small end-to-end example",
                       description="Generate benchmark tables, search plans, validate and show them.")
    add_output(p, "folder for the demo's files (default: out/demo)", dest="out", aliases=("--out",),
               default="out/demo", metavar="DIR")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--num-tables", type=positive_int, default=None,
                   help="tables to generate, as in `tables generate` (default: 6 per device, a run of a "
                        "few minutes on 2 cores, most of it refine); elsewhere --tables names a tables file")
    p.add_argument("--devices", type=device_count, default=None,
                   help="devices (runtime processes) (default: 4, or the CPU cores when fewer, at least 2)")
    from .measured.config import DEMO_ITERATIONS, DEMO_RUNS
    p.add_argument("--iterations", type=positive_int, default=None,
                   help=f"measured iterations per plan and run (default: {DEMO_ITERATIONS}, which keeps the demo "
                        f"within about 5 minutes on 2 cores)")
    p.add_argument("--runs", type=positive_int, default=None,
                   help=f"measurement runs, each plan taking turns of 3 steps with NeuroShard's (default: {DEMO_RUNS})")
    p.add_argument("--calibrate", type=int_in(0, MAX_CALIBRATION_SETS, "a set count"), default=None, metavar="SETS",
                   help="calibrate the cost models on this machine and the demo's tables first, with SETS random "
                        "sets (0: never; default: the demo's set count when this CPU is not the one the checkpoint "
                        "was measured on, else 0)")
    p.add_argument("--refine", type=int_in(0, 20, "a round count"), default=1, metavar="ROUNDS",
                   help="NeuroShard's plan with ROUNDS refine rounds, as `search --refine ROUNDS --judge runtime`: "
                        "its plans and the baselines' timed on this machine, then trained together on the runtime, "
                        "the cheapest there kept (0: the search alone; default: 1)")
    from .measured.config import DEMO_BUDGET_S
    add_budget(p, f"the measured loop's wall clock, its calibration included: seconds or 90s, 5m (none: "
                  f"unbounded; default {DEMO_BUDGET_S:.0f} s, which leaves the runtime comparison time for the "
                  f"demo to end within about 5 minutes on 2 cores)")
    add_quiet(p, "no progress lines (the demo's report is still printed)")
    p.set_defaults(func=_demo)
    add_verbose(parser)  # before or after the subcommand
    return parser


def main(argv: list[str] | None = None) -> int:
    guard_streams()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        missing = missing_input(args)
        if missing:
            parser.error(missing)
    except SystemExit as exc:  # --help (0) or a one-line usage error (2): a code, for in-process callers too
        return exc.code if isinstance(exc.code, int) else 2
    except BrokenPipeError:  # `neuroshard --help | head`
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    # Only neuroshard's own loggers get verbose: libraries (fbgemm) log heavily at INFO.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("neuroshard").setLevel(logging.INFO if args.verbose else logging.WARNING)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except BrokenPipeError:  # `neuroshard ... | head`: the reader left; end quietly, as Unix tools do
        _silence_stdout()
        code = EXIT_BROKEN_PIPE
    except NeuroShardError as exc:
        print(f"neuroshard: error: {exc}", file=sys.stderr)
        code = 2
    except OSError as exc:  # a file or device failed under us (a full disk, a lost mount): one line, exit 2
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"neuroshard: error: {where}{os_reason(exc)}", file=sys.stderr)
        code = 2
    except MemoryError:
        print("neuroshard: error: out of memory (a smaller input, or a machine with more memory)", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("neuroshard: interrupted", file=sys.stderr)
        code = 130
    if code == 0 and isinstance(sys.stdout, ClosedStream) and sys.stdout.lost:
        code = EXIT_BROKEN_PIPE  # the work is done (files written); what it printed was lost
    if getattr(args, "torchrun_rank", False) and torchrun_env() is not None:
        # A rank under torchrun ends as the ranks we spawn do (multiprocessing ends them with
        # os._exit): without interpreter finalization, where a gloo/fbgemm C++ thread still
        # joinable aborts the process ("terminate called without an active exception").
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
