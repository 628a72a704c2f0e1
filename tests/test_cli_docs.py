"""docs/cli.md keeps the facts the code owns: every algorithm's ``--param`` keys and defaults."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from neuroshard.search.registry import ALGORITHMS, get_algorithm

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
OPTIONAL = {"torchrec": "torchrec.distributed.planner", "bayes": "optuna"}


def _documented() -> dict[str, str]:
    """algorithm -> its cell of parameters, from the table under "`--param` keys per algorithm"."""
    text = DOC.read_text()
    table = text[text.index("`--param` keys per algorithm"):]
    rows = {}
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `"))
    for line in lines[start:]:
        if not line.startswith("| `"):
            break
        names, params = line.split(" | ")[0], line.split(" | ")[1].rstrip(" |")
        for name in re.findall(r"`([^`]+)`", names):
            rows[name] = params
    return rows


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_param_key_and_default_is_documented(name):
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    documented = _documented()
    assert name in documented, f"docs/cli.md lists no --param keys for '{name}'"
    params_type = get_algorithm(name).params_type
    if params_type is None:
        assert documented[name] == "(none)"
        return
    for field in dataclasses.fields(params_type):
        assert f"`{field.name}={field.default!r}`" in documented[name], (name, field.name)


def test_evaluate_columns_are_explained_in_help_and_docs():
    """Every column ``evaluate`` prints is explained, the same words in ``--help`` and docs/cli.md."""
    import inspect

    from neuroshard.constants import EVALUATE_COLUMNS
    from neuroshard.runtime import evaluate
    from neuroshard.runtime.trainer import PHASES
    printed = set(PHASES) | set(re.findall(r'row\["(\w+_ms)"\]', inspect.getsource(evaluate.summarize)))
    assert printed <= set(EVALUATE_COLUMNS), printed - set(EVALUATE_COLUMNS)
    text = DOC.read_text()
    for name, meaning in EVALUATE_COLUMNS.items():
        assert f"| `{name}` | {meaning} |" in text, name
