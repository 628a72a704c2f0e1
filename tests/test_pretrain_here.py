"""``neuroshard pretrain --here``: one command measures this machine, fits, holds out, reports and
keeps the result in the machine's folder; a rerun times nothing again; search, estimate and
``shard()`` then use the machine's models by themselves, and a machine with another fingerprint
gets the shipped ones. Run at ``--size tiny`` (a smoke test of the command: real kernels, real
gloo processes, real training runs, a few of each)."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

import neuroshard
from neuroshard.cli import main
from neuroshard.costmodels import DEFAULT_CHECKPOINT, CostModels, load_cost_models
from neuroshard.costmodels.dense import SHIPPED_OPERATOR_COSTS, load_operator_models
from neuroshard.costmodels.samples import store
from neuroshard.measured.machine import HELD_OUT_FAMILIES, PROFILES, TRAINING_FAMILIES, family_of
from neuroshard.tables import TableSet

TINY = PROFILES["tiny"]


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A cache of its own, and ``pretrain --here --size tiny`` run once into it: (the machine's
    folder, the command's output)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("machine-cache")))
        copy = tmp_path_factory.mktemp("copy") / "mine.pt"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["pretrain", "--here", "--size", "tiny", "-o", str(copy)]) == 0
        yield store.machine_dir("cpu"), out.getvalue(), copy


def _lines(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): len(p.read_bytes().splitlines()) for p in sorted(folder.rglob("*.jsonl"))}


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.gloo
def test_the_machine_folder_holds_data_model_operator_costs_and_report(machine):
    folder, printed, copy = machine
    assert folder.name == store.fingerprint_id(store.machine_fingerprint("cpu"))
    for name in ("model.pt", "operators.json", "report.txt", "machine.json"):
        assert (folder / name).is_file(), name
    models = CostModels.load(folder / "model.pt")
    assert models.hardware["machine"]["id"] == folder.name and store.pretrained_here(models.hardware)
    assert CostModels.load(copy).hardware["machine"]["id"] == folder.name  # -o: the same checkpoint elsewhere
    data = folder / "data" / "tiny"
    compute = sum(n for name, n in _lines(data).items() if name.endswith("compute.jsonl"))
    assert compute == TINY.compute_sets
    assert _lines(data)["comm/comm2/comm.jsonl"] == TINY.comm_samples
    # only the training families are collected: the benchmark's held-out families never are
    for tables in (data / "tables").glob("*.json"):
        assert {family_of(t.name) for t in TableSet.read(tables)} <= set(TRAINING_FAMILIES), tables
    operators = json.loads((folder / "operators.json").read_text())
    assert operators["overheads"]["points"], "the overheads of real runs are in the operator costs"
    report = (folder / "report.txt").read_text()
    assert report in printed
    assert "held-out GMAE per family and model kind" in report
    for family in HELD_OUT_FAMILIES:
        assert family in report.split("held out (never collected")[1].splitlines()[0]
    for kind in ("neural", "tree", "analytic", "shipped (another machine)"):
        assert kind in report
    assert any(line.strip().startswith("all ") for line in report.splitlines())


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.gloo
def test_a_second_run_times_nothing_again(machine, capsys):
    folder, _, _ = machine
    before = _lines(folder / "data")
    stamps = {name: (folder / name).stat().st_mtime_ns for name in ("model.pt", "operators.json")}
    state = json.loads((folder / "machine.json").read_text())
    assert main(["pretrain", "--here", "--size", "tiny"]) == 0
    assert _lines(folder / "data") == before
    assert {name: (folder / name).stat().st_mtime_ns for name in stamps} == stamps
    after = json.loads((folder / "machine.json").read_text())
    assert after["last_run"]["measured_now"] == {"compute": 0, "comm": 0}
    assert set(after["last_run"]["skipped"]) == {"fit", "dense", "overheads"}
    assert after["spent_s"].keys() == state["spent_s"].keys()
    assert "up to date, not run again: fit, dense, overheads" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.gloo
def test_search_estimate_and_shard_use_the_machine_models_by_themselves(machine, tmp_path, tables_file, capsys):
    folder, _, _ = machine
    name = f"this machine ({folder.name[:8]})"
    assert load_cost_models().name == name
    assert load_operator_models().hardware_ == json.loads((folder / "operators.json").read_text())["hardware"]
    plan = tmp_path / "plan.json"
    assert main(["search", str(tables_file), "-d", "2", "--memory", "1GiB", "-o", str(plan)]) == 0
    out = capsys.readouterr().out
    assert f"by cost model '{name}'" in out and f"with cost model '{name}'" in out
    provenance = json.loads(plan.read_text())["provenance"]
    assert provenance["cost_model"] == name
    assert provenance["cost_model_path"] == str(folder / "model.pt")
    assert main(["estimate", str(plan), "--tables", str(tables_file)]) == 0
    assert "the operator costs were measured on" not in capsys.readouterr().out
    shard_plan = neuroshard.shard(TableSet.read(tables_file), devices=2, memory="1GiB")
    assert shard_plan.provenance["cost_model"] == name
    assert main(["search", str(tables_file), "-d", "2", "--memory", "1GiB", "--cost-model", str(DEFAULT_CHECKPOINT),
                 "-o", str(plan)]) == 0  # --cost-model still chooses
    assert json.loads(plan.read_text())["provenance"]["cost_model"] == CostModels.load(DEFAULT_CHECKPOINT).name


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.gloo
def test_search_does_not_warn_that_the_machine_model_describes_another_cpu(machine, tmp_path, tables_file, caplog):
    """16 GiB a device is GPU-sized memory, where a model measured on a CPU warns that its estimates
    describe that CPU; the machine's own model describes the machine the plan is for."""
    assert main(["search", str(tables_file), "-d", "2", "--memory", "16GiB", "-o", str(tmp_path / "plan.json")]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["provenance"]["cost_model"].startswith("this machine")
    assert "describe that CPU" not in caplog.text


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.gloo
def test_a_machine_with_another_fingerprint_gets_the_shipped_models(machine, monkeypatch, tmp_path, tables_file):
    folder, _, _ = machine
    real = store.machine_fingerprint
    monkeypatch.setattr(store, "machine_fingerprint", lambda backend="cpu": {**real(backend), "llc_bytes": 1 << 20})
    assert store.this_machine_file(store.MACHINE_MODEL_FILE) is None
    models = load_cost_models()
    assert models.path == DEFAULT_CHECKPOINT and not models.name.startswith("this machine")
    assert not store.pretrained_here(CostModels.load(folder / "model.pt").hardware)
    assert load_operator_models().hardware_ == json.loads(SHIPPED_OPERATOR_COSTS.read_text())["hardware"]
    plan = tmp_path / "plan.json"
    assert main(["search", str(tables_file), "-d", "2", "--memory", "1GiB", "-o", str(plan)]) == 0
    assert json.loads(plan.read_text())["provenance"]["cost_model"] == models.name


@pytest.mark.parametrize("args, message", [
    (["pretrain", "-o", "m.pt"], "--data"),
    (["pretrain", "--data", "d"], "-o/--output"),
    (["pretrain", "--data", "d", "-o", "m.pt", "--minutes", "5"], "--minutes is an option of pretrain --here"),
    (["pretrain", "--here", "--data", "d"], "collects its own data"),
    (["pretrain", "--here", "--no-refit"], "--no-refit"),
])
def test_pretrain_options_of_here_and_of_data_are_kept_apart(args, message, capsys):
    assert main(args) != 0
    assert message in capsys.readouterr().err


def test_overhead_runs_follow_the_device():
    """The overheads stage trains with gloo on the CPU (even where torch sees a GPU: NCCL would put
    the ranks on it), and with nccl on the GPUs only in configurations of at most one process a GPU."""
    from neuroshard.measured.machine_profiles import overhead_runs
    from neuroshard.runtime.overheads import CALIBRATION_CONFIGS
    assert overhead_runs("cpu", CALIBRATION_CONFIGS) == ("gloo", list(CALIBRATION_CONFIGS))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, runnable = overhead_runs("cuda", CALIBRATION_CONFIGS)
    assert backend == "nccl" and runnable == [c for c in CALIBRATION_CONFIGS if c[-1] <= gpus]
    assert {c[-1] for c in CALIBRATION_CONFIGS} >= {2, 3}  # so on this machine (no GPU) none is runnable
