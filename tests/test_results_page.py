"""docs/results.md is what experiments/report.py writes from experiments/results: the page cannot
drift from its generator or from the result files (rerun `make results` after changing either)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results.md"
#: the sections the README and the guide link to
ANCHORS = ("Headline", "Plans against baselines", "Search at scale", "Cost-model accuracy", "Iteration model",
           "Memory tiers", "The demo", "Honest limits")


def test_the_results_page_is_its_generators_output(tmp_path):
    out = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "report.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert text == PAGE.read_text(), "docs/results.md differs from experiments/report.py's output: run `make results`"
    assert text.count("\n") <= 400
    headings = {line[3:] for line in text.splitlines() if line.startswith("## ")}
    assert set(ANCHORS) <= headings
