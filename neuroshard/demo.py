"""``neuroshard demo``: a small end-to-end run on the shipped defaults."""
from __future__ import annotations

import argparse


def run_demo(args: argparse.Namespace) -> int:
    raise NotImplementedError
