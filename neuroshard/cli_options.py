"""One way to say a thing on the command line, for every subcommand.

* The input a command works on is positional, and may also be named with its flag
  (``neuroshard train plan.json`` = ``neuroshard train --plan plan.json``): ``add_input``.
* What a command writes is ``-o/--output`` (older spellings kept as aliases): ``add_output``;
  ``-o -`` writes to standard output where a command writes one file (``write_output``).
* ``-v/--verbose`` is accepted before or after the subcommand: ``add_verbose``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

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
