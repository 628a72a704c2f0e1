"""The model being trained is an input (issue 31, item 1): the ``neuroshard.model/v1``
file, the dense part it builds, and the runtime training it (sharded equal to unsharded)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_cli

from neuroshard.errors import FormatError
from neuroshard.execution.dense import build_dense
from neuroshard.model_spec import DEFAULT_MODEL, ModelSpec
from neuroshard.runtime.model import train_reference
from neuroshard.runtime.trainer import RunConfig, run

STEPS, BATCH, LR = 6, 48, 0.5
CAT = ModelSpec(5, (32, 16), (24,), "cat", "small-cat")


def test_a_model_file_reads_back_and_defaults_to_todays_dlrm(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(CAT.to_dict()))
    assert ModelSpec.read(path) == CAT
    assert ModelSpec.from_dict({}) == ModelSpec(name="model") and DEFAULT_MODEL.interaction == "dot"
    assert "bottom MLP 32-16, cat interaction, top MLP 24" in CAT.describe()
    # the default builds the dense part the runtime always trained: 13 -> 64 -> widest, top 64 -> 1
    dense = build_dense([type("T", (), {"embedding_dim": d})() for d in (16, 8)], seed=0)
    shapes = [tuple(p.shape) for p in dense.parameters()]
    assert shapes[:4] == [(64, 13), (64,), (16, 64), (16,)] and shapes[-2:] == [(1, 64), (1,)]


@pytest.mark.parametrize("data, field", [
    ({"format": "neuroshard.model/v2"}, "format"),
    ({"dense_features": 0}, "dense_features"),
    ({"bottom_mlp": [64, -1]}, "bottom_mlp"),
    ({"top_mlp": "64"}, "top_mlp"),
    ({"interaction": "attention"}, "interaction"),
    ({"botom_mlp": [64]}, "botom_mlp"),
])
def test_a_bad_model_file_is_one_line_naming_the_field(data, field):
    with pytest.raises(FormatError, match=f"m.json: .*'{field}'") as err:
        ModelSpec.from_dict(data, "m.json")
    assert "\n" not in str(err.value)


def test_cat_interaction_trains_like_the_reference(runtime_tables):
    dense = build_dense(runtime_tables, 0, CAT)
    pooled = torch.randn(4, sum(t.embedding_dim for t in runtime_tables))
    assert dense(torch.randn(4, 5), pooled).shape == (4,)


@pytest.mark.gloo
def test_a_sharded_run_of_another_model_equals_its_unsharded_reference(runtime_tables, runtime_plan, tmp_path):
    plan = runtime_plan("mixed", 2)
    result = run(RunConfig(plan, runtime_tables, 2, steps=STEPS, batch_size=BATCH, lr=LR, collect_weights=True,
                           timeout_s=60, model=CAT))
    reference = train_reference(runtime_tables, STEPS, BATCH, LR, model=CAT)
    np.testing.assert_allclose(result.losses, reference.losses, rtol=0, atol=1e-5)
    for t in runtime_tables:
        np.testing.assert_allclose(result.weights[t.name], reference.weights[t.name].numpy(), rtol=0, atol=1e-5)
    default = train_reference(runtime_tables, STEPS, BATCH, LR)
    assert not np.allclose(default.losses, reference.losses)  # the model file changed what was trained
    # the command line takes it too
    model, plan_path, tables_path = tmp_path / "m.json", tmp_path / "p.json", tmp_path / "t.json"
    model.write_text(json.dumps(CAT.to_dict()))
    plan_path.write_text(json.dumps(plan.to_dict()))
    from neuroshard.tables import TableSet
    TableSet("runtime", runtime_tables, batch_size=BATCH).write(tables_path)
    done = run_cli("train", plan_path, "--tables", tables_path, "--steps", "2", "--model", model)
    assert done.returncode == 0, done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"interaction": "attention"}')
    refused = run_cli("train", plan_path, "--tables", tables_path, "--model", bad)
    assert refused.returncode != 0 and "bad.json: field 'interaction'" in refused.stderr
    assert "Traceback" not in refused.stderr
