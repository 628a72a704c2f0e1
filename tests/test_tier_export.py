"""Every memory-tier example of the README and the guide runs as written, and the plan it
writes exports to TorchRec with its tiers' kernels.

A tier example is a ``neuroshard search`` or ``neuroshard capacity`` command with
``--host-memory`` or ``--ssd``, in a code block (run with the block's other commands, in
order: the block makes its own tables) or inline in the text (run after the files the doc
makes: a JSON block followed by "Save it as `NAME`"). Each plan it writes (``-o``; capacity's
``NAME.tiered-plan.json``) is exported with ``neuroshard export PLAN --format torchrec
--compute-device cuda``, and every table's record must carry its tier's kernel:
``fused_uvm_caching`` with the cache fraction as load factor, ``fused_uvm``, ``key_value``,
or the device-memory kernel. A doc that changes to an example whose plan does not export
fails here, naming the example.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from neuroshard.cli import main
from neuroshard.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/guide.md")
TIER_OPTIONS = ("--host-memory", "--ssd")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SAVED_AS = re.compile(r"\s*Save it as `([^`]+)`")


def _command(text: str) -> str | None:
    """``text`` as one ``neuroshard`` command (whitespace runs joined, a trailing comment cut), or None."""
    text = " ".join(text.replace("\\\n", " ").split())
    text = text.split(" # ")[0].strip()
    return text if text.startswith("neuroshard ") and "..." not in text and "…" not in text else None


def _is_tier_example(command: str) -> bool:
    words = shlex.split(command)
    return words[1] in ("search", "capacity") and any(w.split("=")[0] in TIER_OPTIONS for w in words)


def tier_examples(doc: str) -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """(name, commands to run in order) of every tier example of ``doc``, and the files the
    doc makes (name -> text: a JSON block followed by "Save it as `NAME`")."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    files: dict[str, str] = {}
    examples: list[tuple[str, list[str]]] = []
    for block in FENCE.finditer(text):
        line = text.count("\n", 0, block.start()) + 1
        saved = SAVED_AS.match(text, block.end())
        if block.group(1) == "json" and saved:
            files[saved.group(1)] = block.group(2)
            continue
        lines = re.sub(r"\\\n", " ", block.group(2)).splitlines()
        commands = [c for c in map(_command, lines) if c]
        if any(_is_tier_example(c) for c in commands):
            examples.append((f"{doc}:{line}", commands))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # line numbers kept
    for span in re.finditer(r"`([^`]+)`", prose):
        command = _command(span.group(1))
        if command and _is_tier_example(command):
            examples.append((f"{doc}:{prose.count(chr(10), 0, span.start()) + 1}", [command]))
    return examples, files


def _examples() -> list[tuple[str, list[str], dict[str, str]]]:
    out = []
    for doc in DOCS:
        examples, files = tier_examples(doc)
        out += [(name, commands, files) for name, commands in examples]
    return out


EXAMPLES = _examples()


def test_both_docs_have_tier_examples():
    assert {name.split(":")[0] for name, _, _ in EXAMPLES} == set(DOCS)


def _plans_written(command: str) -> list[str]:
    """The plan files a tier command writes: search's ``-o``, capacity's tiered plan beside its report."""
    words = shlex.split(command)
    out = next(words[i + 1] for i, w in enumerate(words) if w in ("-o", "--output"))
    return [out] if words[1] == "search" else [str(Path(out).with_suffix("")) + ".tiered-plan.json"]


def _check_kernels(where: str, plan: Plan, exported: dict) -> int:
    """Every table's kernel is its tier's; returns how many tables are outside device memory."""
    outside = 0
    for name, tier in plan.tiers().items():
        record = exported["tables"][name]
        kernel, params = record["compute_kernel"], record.get("cache_params", {})
        if tier.on_device:
            assert kernel in ("fused", "dense"), f"{where}: table '{name}' in device memory runs {kernel}"
            continue
        outside += 1
        if tier.memory == "ssd":
            assert kernel == "key_value", f"{where}: table '{name}' on SSD runs {kernel}"
        else:
            assert kernel == ("fused_uvm_caching" if tier.cached else "fused_uvm"), \
                f"{where}: table '{name}' in host memory (cache {tier.cache_fraction}) runs {kernel}"
        if tier.cached:
            assert params.get("load_factor") == pytest.approx(tier.cache_fraction), \
                f"{where}: table '{name}' caches {tier.cache_fraction} of its rows, exported {params}"
    return outside


@pytest.mark.slow
@pytest.mark.parametrize("where,commands,files", EXAMPLES, ids=[name for name, _, _ in EXAMPLES])
def test_tier_example_runs_and_exports_to_torchrec(where, commands, files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        Path(name).write_text(content, encoding="utf-8")
    for command in commands:
        code = main(shlex.split(command)[1:])
        assert code == 0, f"{where}: `{command}` exited {code}: {capsys.readouterr().err.strip()[-600:]}"
        if not _is_tier_example(command):
            continue
        for written in _plans_written(command):
            exported = f"{written}.torchrec.json"
            code = main(["export", written, "--format", "torchrec", "--compute-device", "cuda", "-o", exported])
            assert code == 0, (f"{where}: the plan of `{command}` does not export to TorchRec: "
                               f"{capsys.readouterr().err.strip()[-600:]}")
            document = json.loads(Path(exported).read_text())
            assert document["compute_device"] == "cuda"
            outside = _check_kernels(where, Plan.read(written), document)
            if shlex.split(command)[1] == "search":  # what the example is there to show
                assert outside >= 1, f"{where}: `{command}` keeps every table in device memory"


def test_export_defaults_to_cuda(tmp_path, capsys):
    """``neuroshard export`` without ``--compute-device`` places shards on GPUs, on any machine."""
    from neuroshard.plan import Shard
    from neuroshard.tables import Table
    plan = Plan([Table("t", 100, 8, 1.0)], [Shard("t", 0, 100, 0, 8, 1)], 2, 10**6)
    plan.write(tmp_path / "plan.json")
    assert main(["export", str(tmp_path / "plan.json"), "-o", str(tmp_path / "x.json")]) == 0
    document = json.loads((tmp_path / "x.json").read_text())
    assert document["compute_device"] == "cuda"
    assert document["tables"]["t"]["sharding_spec"][0]["placement"] == "rank:1/cuda:1"
    assert main(["export", str(tmp_path / "plan.json"), "--compute-device", "cpu", "-o",
                 str(tmp_path / "y.json")]) == 0
    assert json.loads((tmp_path / "y.json").read_text())["tables"]["t"]["sharding_spec"][0]["placement"] == \
        "rank:1/cpu"


def test_host_memory_and_ssd_together_hold_what_the_ssd_can():
    """Host memory too small for every table off the devices, and SSD beside it: the tables
    the second pass moves off the devices go where there is room, never over the hosts."""
    from neuroshard.costmodels.loading import analytic_cost_models
    from neuroshard.optimizers import shard_bytes
    from neuroshard.search.simulator import Simulator
    from neuroshard.search.tiers import choose_tiers
    from neuroshard.tables import Table, TableSet
    from neuroshard.topology import make_topology

    tables = TableSet("big-model", [Table(f"t{i}", 50_000 * (1 + i % 3), 128, 2.0 + i % 4,
                                          {"zipf_alpha": 0.8 + 0.1 * (i % 5)}) for i in range(12)], 16384)
    host = 16 * 2**30 // 100
    sim = Simulator(tables, 4, analytic_cost_models(),
                    topology=make_topology(4, host_memory_bytes=host, ssd_bytes=2**40))
    tiers, record = choose_tiers(sim, 8 * 2**30 // 100)  # the first two passes put 21.5 GiB/100 in host memory
    in_host = sum(shard_bytes(t.num_embeddings, t.embedding_dim, 4, sim.optimizer)
                  for t, tier in zip(tables, tiers) if tier.memory == "host")
    assert 0 < in_host <= host
    assert any(tier.memory == "ssd" for tier in tiers) and set(record["tables"]) >= {"host+cache", "ssd+cache"}


@pytest.mark.slow
@pytest.mark.parametrize("devices,per_host,memory_mib", [(3, 3, 20), (6, 6, 10), (8, 2, 10), (12, 4, 5), (16, 8, 4)])
def test_tiered_plans_export_on_any_device_count_and_host_layout(devices, per_host, memory_mib):
    """The README's tables (rows / 100) on devices too small for them, hosts of ``per_host``:
    the tiered plan's row-split tables are laid out as TorchRec runs them."""
    from neuroshard import shard
    from neuroshard.costmodels.loading import analytic_cost_models
    from neuroshard.tables import Table, TableSet
    from neuroshard.topology import make_topology
    from neuroshard.torchrec.export import torchrec_sharding

    tables = TableSet("my-model", [Table("user_id", 200_000, 128, 1.0, {"zipf_alpha": 1.05}),
                                   Table("item_history", 50_000, 64, 30.0, {"zipf_alpha": 1.2}),
                                   Table("country", 250, 16, 1.0)], 16384)
    plan = shard(tables, devices, memory_mib * 2**20, cost_models=analytic_cost_models(),
                 topology=make_topology(devices, per_host, host_memory_bytes=2**30))
    document = torchrec_sharding(plan)  # raises, naming the table, for a layout TorchRec cannot run
    assert _check_kernels(f"{devices} devices, {per_host} per host", plan, document) >= 1
    assert any(r["sharding_type"] in ("row_wise", "table_row_wise", "grid_shard") for r in document["tables"].values())


GRID_TABLES = {"format": "neuroshard.tables/v1", "name": "my-model", "batch_size": 16384, "tables": [
    {"name": "user_id", "num_embeddings": 200_000, "embedding_dim": 128, "pooling_factor": 1.0,
     "access": {"zipf_alpha": 1.05}},
    {"name": "item_history", "num_embeddings": 50_000, "embedding_dim": 64, "pooling_factor": 30.0,
     "access": {"zipf_alpha": 1.2}},
    {"name": "country", "num_embeddings": 250, "embedding_dim": 16, "pooling_factor": 1.0}]}


@pytest.mark.parametrize("algorithm", ["size-lookup", "lookup", "size", "random", "bayes"])
@pytest.mark.parametrize("devices,per_host,memory", [(8, 2, "10MiB"), (16, 2, "4MiB"), (12, 4, "5MiB"),
                                                     (16, 4, "4MiB")])
def test_baselines_tiered_plans_export_on_any_host_layout(algorithm, devices, per_host, memory, tmp_path):
    """The README's tables (rows / 100) on devices too small for them, hosts of ``per_host``:
    the greedy baselines' and bayes' tiered plans export, as written by ``search``."""
    tables, plan, exported = tmp_path / "tables.json", tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    tables.write_text(json.dumps(GRID_TABLES), encoding="utf-8")
    assert main(["search", str(tables), "-d", str(devices), "-m", memory, "--local-world-size", str(per_host),
                 "--host-memory", "1GiB", "-a", algorithm, "-o", str(plan)]) == 0
    assert main(["export", str(plan), "--format", "torchrec", "--compute-device", "cuda", "-o", str(exported)]) == 0
    written = Plan.read(plan)
    assert _check_kernels(f"{algorithm} on {devices} devices, {per_host} per host", written,
                          json.loads(exported.read_text())) >= 1
