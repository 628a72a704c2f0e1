"""One way to say a thing on the command line, for every subcommand.

* The input a command works on is positional, and may also be named with its flag
  (``neuroshard train plan.json`` = ``neuroshard train --plan plan.json``): ``add_input``.
* What a command writes is ``-o/--output`` (older spellings kept as aliases): ``add_output``;
  ``-o -`` writes to standard output where a command writes one file (``write_output``).
* ``-v/--verbose`` is accepted before or after the subcommand: ``add_verbose``.
* ``-q/--quiet`` silences progress (errors and results stay): ``add_quiet``.
* ``--budget`` bounds the measured loop's wall clock (``300``, ``90s``, ``5m``, ``none``): ``add_budget``.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

#: ``-o -``: write to standard output (and what a command says to standard error)
STDOUT = "-"


class _Input(argparse.Action):
    """Store an input given positionally or by its flag; both at once must agree."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is None:  # the positional left out: keep what the flag said
            return
        given = getattr(namespace, self.dest, None)
        if given is not None and given != values:
            parser.error(f"{self.dest} given twice ({given!r} and {values!r})")
        setattr(namespace, self.dest, values)


def add_input(p: argparse.ArgumentParser, name: str, help: str, metavar: str | None = None) -> None:
    """A required input ``name``: positional, or ``--name`` (``missing_inputs`` reports its absence)."""
    metavar = metavar or name.upper()
    p.add_argument(name, nargs="?", action=_Input, default=None, metavar=metavar, help=f"{help} (or --{name})")
    p.add_argument(f"--{name}", dest=name, action=_Input, default=None, metavar=metavar, help=argparse.SUPPRESS)
    p.set_defaults(required_input=name)


def missing_input(args: argparse.Namespace) -> str | None:
    """The usage error for a required input given neither way (None when it was given)."""
    name = getattr(args, "required_input", None)
    if name is not None and getattr(args, name, None) is None:
        return f"the following arguments are required: {name.upper()} (or --{name})"
    return None


def add_output(p: argparse.ArgumentParser, help: str, *, dest: str = "output", aliases: Sequence[str] = (),
               required: bool = False, default: Any = None, metavar: str | None = None, **extra: Any) -> None:
    """``-o/--output`` (and ``aliases``, older spellings) into ``dest``; ``extra`` as ``add_argument``'s."""
    p.add_argument("-o", "--output", *aliases, dest=dest, required=required, default=default, metavar=metavar,
                   help=help, **extra)


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``-v/--verbose`` on ``parser`` and, without overriding it, on every subcommand below it."""
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    todo = [parser]
    while todo:
        for action in todo.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    if not any("-v" in a.option_strings for a in sub._actions):
                        sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                         help="log progress details")
                    todo.append(sub)


def write_output(path: str | Path, text: str) -> Callable[..., None]:
    """Write ``text`` to ``path`` atomically, or to standard output when ``path`` is ``-``;
    returns the ``print`` for what the command says next (standard error after ``-o -``)."""
    if str(path) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return lambda *a, **k: print(*a, file=sys.stderr, **k)
    from .io import atomic_write_text
    atomic_write_text(path, text)
    return print


def help_table(title: str, rows: Mapping[str, str]) -> str:
    """A ``--help`` epilog: ``title`` then one wrapped entry per name (use it with
    ``argparse.RawDescriptionHelpFormatter``, which keeps the lines as made here)."""
    return title + "\n" + "\n".join(
        textwrap.fill(text, 96, initial_indent=f"  {name:17s}", subsequent_indent=" " * 19)
        for name, text in rows.items())


def add_weights_precision(p: argparse.ArgumentParser) -> None:
    """``--weights-precision``: the element type of the embedding weights a kernel is timed with."""
    p.add_argument("--weights-precision", default="fp32", choices=("fp32", "fp16", "int8"),
                   help="element type of the embedding weights timed: fp32 or fp16 (int8 is refused: "
                        "fbgemm-gpu-cpu cannot train it on CPU) (default fp32)")


def add_comm_precision(p: argparse.ArgumentParser) -> None:
    """``--comm-precision``: the element type the all-to-all of pooled embeddings sends."""
    from .validate import COMM_PRECISIONS
    p.add_argument("--comm-precision", default="fp32", choices=COMM_PRECISIONS,
                   help="element type of the pooled embeddings and their gradients in the all-to-all: fp16 and "
                        "bf16 halve its bytes (default fp32)")


def add_topology_options(p: argparse.ArgumentParser) -> None:
    """``--topology FILE`` and the flags that state or replace its hosts and links
    (``neuroshard.topology``; the GPU-cluster defaults fill in what is left out)."""
    from .constants import DEFAULT_INTER_HOST_GBPS, DEFAULT_INTRA_HOST_GBPS
    from .validate import device_count, positive_float
    p.add_argument("--topology", default=None, metavar="FILE",
                   help="topology file (neuroshard.topology/v1): devices per host, link bandwidths, per-device "
                        "memory and relative speed (default: identical devices on the measured network)")
    p.add_argument("--local-world-size", type=device_count, default=None, metavar="N",
                   help="devices per host: the all-to-all is then costed over the links below, split into its "
                        "intra- and inter-host parts")
    p.add_argument("--intra-host-gbps", type=positive_float, default=None, metavar="GB/S",
                   help=f"bandwidth within a host, GB/s (default with hosts: {DEFAULT_INTRA_HOST_GBPS:g}, NVLink)")
    p.add_argument("--inter-host-gbps", type=positive_float, default=None, metavar="GB/S",
                   help=f"bandwidth per device across hosts, GB/s (default with hosts: {DEFAULT_INTER_HOST_GBPS:g}, "
                        f"one 100 Gbit/s NIC per GPU)")
    add_tier_options(p)


def add_tier_options(p: argparse.ArgumentParser) -> None:
    """The memory-tier flags (``topology.TIER_KEYS``; ``tier_options`` reads them back)."""
    from .constants import DEFAULT_HOST_LINK_GBPS, DEFAULT_SSD_GBPS, DEFAULT_SSD_IOPS
    from .validate import memory_size, positive_float
    tiers = p.add_argument_group("memory tiers (tables larger than the devices' memory; neuroshard.tiers)")
    tiers.add_argument("--host-memory", type=memory_size, default=None, metavar="SIZE",
                       help="host memory per host for tables (their rows in host memory, a device cache in front): "
                            "stating it lets the search use it when the devices' memory is not enough")
    tiers.add_argument("--ssd", type=memory_size, default=None, metavar="SIZE",
                       help="SSD capacity per host for tables (fbgemm's key_value tables)")
    tiers.add_argument("--host-link-gbps", type=positive_float, default=None, metavar="GB/S",
                       help=f"host memory to one device, GB/s (default {DEFAULT_HOST_LINK_GBPS:g}: PCIe 4.0 x16, "
                            f"TorchRec's HBM_TO_DDR_MEM_BW)")
    tiers.add_argument("--ssd-gbps", type=positive_float, default=None, metavar="GB/S",
                       help=f"random-read GB/s of a host's SSD, shared by its devices (default {DEFAULT_SSD_GBPS:g}: "
                            f"one data-centre NVMe drive)")
    tiers.add_argument("--ssd-iops", type=positive_float, default=None, metavar="N",
                       help=f"random reads per second of a host's SSD (default {DEFAULT_SSD_IOPS:,})")


def tier_options(args: argparse.Namespace) -> dict:
    """The memory-tier flags as ``topology.TIER_KEYS`` (None where not given)."""
    return {"host_memory_bytes": args.host_memory, "ssd_bytes": args.ssd, "host_link_gbps": args.host_link_gbps,
            "ssd_gbps": args.ssd_gbps, "ssd_iops": args.ssd_iops}


def add_model_option(p: argparse.ArgumentParser, what: str = "the dense part to train") -> None:
    """``--model MODEL.json``: the DLRM's dense part (``neuroshard.model/v1``), one wording for
    every command that takes it (train, evaluate, search, estimate)."""
    p.add_argument("--model", default=None, metavar="MODEL.json",
                   help=f"{what} (neuroshard.model/v1: dense features, bottom and top MLP widths, dot or cat "
                        "interaction; default: 13 dense features, MLPs of 64, dot)")


def model_option(args: argparse.Namespace):
    """The ``--model`` file read (a one-line FormatError when it is wrong), or the default DLRM."""
    from .model_spec import DEFAULT_MODEL, ModelSpec
    return ModelSpec.read(args.model) if getattr(args, "model", None) is not None else DEFAULT_MODEL


def add_quiet(p: argparse.ArgumentParser, what: str = "no progress line (errors and results are still printed)"
              ) -> None:
    """``-q/--quiet``: no progress (``progress_mode`` reads it back)."""
    p.add_argument("-q", "--quiet", action="store_true", help=what)


def progress_mode(args: argparse.Namespace) -> str:
    """The measured loop's progress mode (``measured.progress``) for ``-q``: quiet, else auto (a line
    updated in place on a terminal, plain lines in a log)."""
    return "quiet" if getattr(args, "quiet", False) else "auto"


def budget_seconds(text: str) -> float:
    """An argparse type: a budget in seconds (``measured.budget.parse_budget``: ``300``, ``90s``,
    ``5m``, ``1h``; ``none``: unbounded)."""
    from .errors import NeuroShardError
    from .measured.budget import parse_budget
    try:
        return parse_budget(text)
    except NeuroShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_budget(p: argparse.ArgumentParser, help: str) -> None:
    """``--budget``: the measured loop's wall clock (``budget_seconds``; None when not given)."""
    p.add_argument("--budget", type=budget_seconds, default=None, metavar="SECONDS", help=help)
