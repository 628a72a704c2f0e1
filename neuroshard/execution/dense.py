"""The dense part of the DLRM as torch modules.

``DenseArch`` is what the runtime trains (``runtime.model`` builds it from a
``model_spec.ModelSpec``); ``model_spec.dense_operators`` lists, for a spec, the tables' widths and a
rank's local batch, every operator of that module's forward and backward with its shape:
the iteration-time model (``search.iteration``) prices each one with the operator cost
models (``costmodels.dense``), and ``collect dense`` times these same modules, so what is
measured, what is predicted and what trains are one code.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..model_spec import DEFAULT_MODEL, ModelSpec


def mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ...`` with ReLU after each (after the last
    only with ``last_relu``)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Interaction(nn.Module):
    """The feature interaction: ``dot`` (every pair of the bottom output and the tables'
    pooled embeddings dotted, tables whose width differs from the interaction width
    projected to it first, then the bottom output beside the dots) or ``cat`` (the bottom
    output and the pooled embeddings side by side)."""

    def __init__(self, table_dims: Sequence[int], feature_dim: int, kind: str) -> None:
        super().__init__()
        self.table_dims = list(table_dims)
        self.kind = kind
        n = len(self.table_dims) + 1
        if kind == "dot":
            self.projections = nn.ModuleList(
                nn.Identity() if d == feature_dim else nn.Linear(d, feature_dim, bias=False)
                for d in self.table_dims)
            self.out_dim = feature_dim + n * (n - 1) // 2
        else:
            self.out_dim = feature_dim + sum(self.table_dims)
        rows, cols = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("_pairs", rows * n + cols, persistent=False)

    def forward(self, x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        if self.kind == "cat":
            return torch.cat([x, pooled], dim=1)
        parts = torch.split(pooled, self.table_dims, dim=1)
        features = torch.stack([x] + [p(e) for p, e in zip(self.projections, parts)], dim=1)
        dots = torch.bmm(features, features.transpose(1, 2)).flatten(1)[:, self._pairs]
        return torch.cat([x, dots], dim=1)


class DenseArch(nn.Module):
    """Bottom MLP over dense features, the interaction with the pooled embeddings, top
    MLP to one logit, as ``spec`` says (``model_spec``; default: today's DLRM)."""

    def __init__(self, table_dims: Sequence[int], spec: ModelSpec = DEFAULT_MODEL) -> None:
        super().__init__()
        self.table_dims = list(table_dims)
        self.interaction = spec.interaction
        self.feature_dim = max(self.table_dims)
        self.bottom = mlp([spec.dense_features, *spec.bottom_mlp, self.feature_dim], last_relu=True)
        self.interact = Interaction(self.table_dims, self.feature_dim, spec.interaction)
        self.top = mlp([self.interact.out_dim, *spec.top_mlp, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits (batch,) from dense features (batch, dense_features) and the pooled
        embeddings of all tables side by side (batch, sum of table widths)."""
        return self.top(self.interact(self.bottom(dense), pooled)).squeeze(1)


def build_dense(tables: Sequence, seed: int, spec: ModelSpec = DEFAULT_MODEL) -> DenseArch:
    """The dense part of ``tables`` (anything with ``embedding_dim``), initialised from
    ``seed`` (the same on every process)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DenseArch([t.embedding_dim for t in tables], spec)
