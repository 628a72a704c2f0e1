"""NeuroShardPlanner is used from Python: when the tables do not fit, its refusal names the
arguments a user of it changes (the Topology's world_size and memory cap, the storage
reservation), not the command line's flags."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("torchrec")
pytest.importorskip("torchrec.distributed.planner")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import Topology  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: E402

from neuroshard.costmodels import analytic_cost_models  # noqa: E402
from neuroshard.errors import InfeasibleError  # noqa: E402
from neuroshard.torchrec import NeuroShardPlanner  # noqa: E402


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=f"t{i}", num_embeddings=100_000, embedding_dim=64, feature_names=[f"f{i}"])
            for i in range(4)], device=torch.device("meta"))


@pytest.mark.parametrize("device, cap", [("cuda", "hbm_cap"), ("cpu", "ddr_cap")])
def test_tables_too_big_name_the_planners_arguments_not_cli_flags(device, cap):
    planner = NeuroShardPlanner(Topology(world_size=2, compute_device=device, **{cap: 10**6}),
                                cost_models=analytic_cost_models(), log_stats=False, storage_reservation=0.25)
    with pytest.raises(InfeasibleError) as caught:
        planner.plan(Model(), [EmbeddingBagCollectionSharder()])
    message = str(caught.value)
    assert not re.search(r"(^|\s|\()--?[a-z]", message), message  # no --host-memory, --ssd, -d, -m
    assert "Topology's world_size" in message and f"its {cap}" in message
    assert "storage_reservation keeps back 0.25" in message and "ranks of this memory" in message
