"""Subcommands of this stage (registered by ``neuroshard.cli``)."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add this stage's subcommands."""
