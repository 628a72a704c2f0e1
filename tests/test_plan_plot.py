"""``plan show --plot FILE.png``: per device the estimated compute and exchange and the memory
by tier, as a PNG of the size ``plot_size_px`` gives; a bad name is refused in one line
before any work."""
from __future__ import annotations

import json
import struct

import pytest

from neuroshard.cli import main
from neuroshard.plan_cli import plot_size_px
from neuroshard.search.api import search_plan
from neuroshard.tables import Table, TableSet
from neuroshard.topology import make_topology

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiered_plan(tmp_path_factory):
    """Six devices, two tables too large for them behind host-memory caches."""
    from neuroshard.costmodels.loading import analytic_cost_models
    tables = TableSet("plot", [Table("big", 200_000, 64, 2.0, {"zipf_alpha": 1.1}),
                               Table("wide", 40_000, 128, 4.0),
                               *(Table(f"t{i}", 1000 * (i + 1), 16, 2.0) for i in range(6))], 4096)
    plan = search_plan(tables, 6, "4MiB", cost_models=analytic_cost_models(),
                       topology=make_topology(6, 2, host_memory_bytes=2**30))
    assert plan.tiered
    return plan.write(tmp_path_factory.mktemp("plot") / "plan.json")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_is_a_png_of_the_expected_size(tiered_plan, tmp_path, capsys):
    png = tmp_path / "plan.png"
    assert main(["plan", "show", str(tiered_plan), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"wrote {png}") and "device 0:" in out  # the usual text, then the picture
    assert _png_size(png.read_bytes()) == plot_size_px(6)
    assert plot_size_px(6) != plot_size_px(40) and plot_size_px(100_000) == plot_size_px(200_000)  # bounded


def test_plot_writes_through_a_symlink(tiered_plan, tmp_path):
    target, link = tmp_path / "target.png", tmp_path / "link.png"
    target.write_bytes(b"old")
    link.symlink_to(target)
    assert main(["plan", "show", str(tiered_plan), "--plot", str(link)]) == 0
    assert link.is_symlink() and target.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("name,reason", [
    ("plan.jpg", "the plot is a PNG; give a file name ending in .png"),
    ("folder.png", "plot is a folder; give a file name"),
    ("file.txt/plan.png", "is not a folder"),
])
def test_bad_plot_names_are_refused_in_one_line(tiered_plan, tmp_path, capsys, name, reason):
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "file.txt").write_text("a file, not a folder")
    assert main(["plan", "show", str(tiered_plan), "--plot", str(tmp_path / name)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before anything is shown
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuroshard: error: ") and reason in lines[0], lines


def test_a_torchrec_export_is_not_plotted(tiered_plan, tmp_path, capsys):
    exported = tmp_path / "x.json"
    assert main(["export", str(tiered_plan), "--format", "torchrec", "-o", str(exported)]) == 0
    assert json.loads(exported.read_text())["format"].startswith("neuroshard.torchrec")
    capsys.readouterr()
    assert main(["plan", "show", str(exported), "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot draws a plan file" in capsys.readouterr().err and not (tmp_path / "x.png").exists()
