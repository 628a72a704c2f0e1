"""Sizes that cannot be misread: text needs a unit below MIN_BARE_BYTES, one-letter units are
refused with both spellings, and the CLI, the topology file and the Python API read them alike;
numbers are read in ASCII by every option; a --param given twice is refused."""
from __future__ import annotations

import json

import pytest

from neuroshard import shard
from neuroshard.cli import main
from neuroshard.errors import NeuroShardError
from neuroshard.tables import TableSet
from neuroshard.topology import Topology
from neuroshard.units import MIN_BARE_BYTES, parse_bytes


def test_units_read_as_written():
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("16gib") == 16 * 2**30
    assert parse_bytes("16GB") == 16 * 10**9 and parse_bytes("16gb") == 16 * 10**9
    assert parse_bytes("16B") == 16 and parse_bytes("1.5 MiB") == 1572864
    assert parse_bytes(str(MIN_BARE_BYTES)) == MIN_BARE_BYTES == parse_bytes(MIN_BARE_BYTES)


@pytest.mark.parametrize("text, said", [
    ("16G", "'16G' is ambiguous: write 16GiB (17,179,869,184 bytes) or 16GB (16,000,000,000 bytes)"),
    ("512m", "write 512MiB (536,870,912 bytes) or 512MB (512,000,000 bytes)"),
    ("16", "'16' has no unit: write e.g. 16GiB or 16GB, or 16B if you mean 16 bytes"),
    (str(MIN_BARE_BYTES - 1), "has no unit"),
    ("１６GiB", "cannot read a memory size"),
    ("12 parsecs", "cannot read a memory size"),
])
def test_sizes_that_could_be_misread_are_refused(text, said):
    with pytest.raises(NeuroShardError) as err:
        parse_bytes(text)
    assert said in str(err.value)


def test_the_cli_the_topology_file_and_the_api_read_sizes_alike(tables_file, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["search", str(tables_file), "-d", "2", "-m", "16G", "-o", str(out)]) == 2
    assert "ambiguous" in capsys.readouterr().err and not out.exists()
    assert main(["search", str(tables_file), "-d", "2", "-m", "16", "-o", str(out)]) == 2
    assert "has no unit" in capsys.readouterr().err
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps({"format": "neuroshard.topology/v1", "num_devices": 2, "device_memory_bytes": "16G"}))
    with pytest.raises(NeuroShardError, match="ambiguous"):
        Topology.read(topo)
    with pytest.raises(NeuroShardError, match="has no unit"):
        shard(TableSet.read(tables_file), devices=2, memory="16")
    assert parse_bytes(16) == 16  # a number is bytes: its field (device_memory_bytes, memory) says so


def test_numbers_are_ascii_everywhere_and_a_param_given_twice_is_refused(tables_file, tmp_path, capsys):
    out = str(tmp_path / "plan.json")
    assert main(["search", str(tables_file), "-d", "\uff12", "-m", "1MiB", "-o", out]) == 2
    assert "expected a device count, got '\uff12'" in capsys.readouterr().err
    assert main(["search", str(tables_file), "-d", "2", "-m", "1MiB", "--param", "beam_width=2",
                 "--param", "beam_width=3", "-o", out]) == 2
    assert "--param beam_width is given twice (2 and 3)" in capsys.readouterr().err
