"""docs/extending.md stays true to the code: its Python blocks run, in order, in one
fresh process (registering an algorithm, a cost model, a kernel and an exporter there
leaves this process's registries alone)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "extending.md"


def test_every_example_of_extending_md_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 6, "the shared tables and one example per extension point"
    code = "\n".join(blocks) + "\nprint('all examples ran')\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "all examples ran" in out.stdout
