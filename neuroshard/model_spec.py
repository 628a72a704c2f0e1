"""The dense part of the DLRM being trained: the ``neuroshard.model/v1`` file.

Users decide with iteration time, and the dense layers share the step with the
embeddings. A model file says what the dense part is; without one, the
runtime trains today's default DLRM (13 dense features, bottom MLP 64, dot interaction,
top MLP 64):

```json
{"format": "neuroshard.model/v1", "name": "dlrm-small", "dense_features": 13,
 "bottom_mlp": [512, 256], "top_mlp": [1024, 512, 256], "interaction": "dot"}
```

* ``bottom_mlp``: hidden widths of the MLP over the dense features; its output width is
  the interaction width (the widest table's ``embedding_dim``: narrower tables are
  projected to it for ``dot``);
* ``top_mlp``: hidden widths of the MLP from the interaction to the one logit;
* ``interaction``: ``dot`` (pairwise dot products of the bottom output and every table's
  pooled embedding, as DLRM) or ``cat`` (the bottom output and the pooled embeddings side
  by side).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import FormatError
from .validate import check_format, check_name, is_int, read_json

MODEL_FORMAT = "neuroshard.model/v1"
INTERACTIONS = ("dot", "cat")
#: widest layer and most layers a model file may give (a typo guard: sizes stay trainable)
MAX_LAYER_WIDTH = 65536
MAX_LAYERS = 16
MAX_DENSE_FEATURES = 4096
_KEYS = ("format", "name", "dense_features", "bottom_mlp", "top_mlp", "interaction")


@dataclass(frozen=True)
class ModelSpec:
    """The dense part of a DLRM (see the module docstring)."""

    dense_features: int = 13
    bottom_mlp: tuple[int, ...] = (64,)
    top_mlp: tuple[int, ...] = (64,)
    interaction: str = "dot"
    name: str = "default"

    def to_dict(self) -> dict:
        return {"format": MODEL_FORMAT, "name": self.name, "dense_features": self.dense_features,
                "bottom_mlp": list(self.bottom_mlp), "top_mlp": list(self.top_mlp),
                "interaction": self.interaction}

    def describe(self) -> str:
        """One line: ``dlrm-small: 13 dense features, bottom MLP 512-256, dot, top MLP 1024-512-256``."""
        def widths(layers: tuple[int, ...]) -> str:
            return "-".join(str(w) for w in layers) or "none"
        return (f"{self.name}: {self.dense_features} dense features, bottom MLP {widths(self.bottom_mlp)}, "
                f"{self.interaction} interaction, top MLP {widths(self.top_mlp)}")

    @classmethod
    def from_dict(cls, data: Any, source: str = "model") -> "ModelSpec":
        """A checked spec; one-line FormatError naming the file and field otherwise."""
        if not isinstance(data, Mapping):
            raise FormatError(f"{source}: a model file must be a JSON object")
        check_format(data, MODEL_FORMAT, source, optional=True)
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise FormatError(f"{source}: unknown field {unknown[0]!r} (a model file has {', '.join(_KEYS)})")
        default = cls()
        dense = data.get("dense_features", default.dense_features)
        if not (is_int(dense) and 1 <= dense <= MAX_DENSE_FEATURES):
            raise FormatError(f"{source}: field 'dense_features' must be an integer in [1, {MAX_DENSE_FEATURES}], "
                              f"got {dense!r}"[:300])
        layers = {}
        for key in ("bottom_mlp", "top_mlp"):
            value = data.get(key, list(getattr(default, key)))
            if not (isinstance(value, list) and len(value) <= MAX_LAYERS
                    and all(is_int(w) and 1 <= w <= MAX_LAYER_WIDTH for w in value)):
                raise FormatError(f"{source}: field '{key}' must be a list of at most {MAX_LAYERS} layer widths, "
                                  f"integers in [1, {MAX_LAYER_WIDTH}], got {value!r}"[:300])
            layers[key] = tuple(value)
        interaction = data.get("interaction", default.interaction)
        if interaction not in INTERACTIONS:
            raise FormatError(f"{source}: field 'interaction' must be one of {', '.join(INTERACTIONS)}, "
                              f"got {interaction!r}"[:300])
        name = check_name(data.get("name", Path(source).stem if source != "model" else "model"), source, "name")
        return cls(dense, layers["bottom_mlp"], layers["top_mlp"], interaction, name)

    @classmethod
    def read(cls, path: str | Path) -> "ModelSpec":
        path = Path(path)
        return cls.from_dict(read_json(path, "model file"), str(path))


#: what the runtime trains without a model file
DEFAULT_MODEL = ModelSpec()


# ------------------------------------------------------------ its operators, counted from the spec
@dataclass(frozen=True)
class Operator:
    """One operator of a training step's dense part: its kind (an operator cost model's
    name: ``linear``, ``interaction_dot``, ``interaction_cat``, ``loss``, ``optimizer``) and
    its shape (``features``, the cost model's inputs in ``costmodels.dense.FEATURES`` order),
    and where it runs (``forward`` or ``backward``: both for the layers, ``step`` for the
    optimizer)."""

    kind: str
    features: tuple[float, ...]
    where: str = ""


def dense_operators(spec: ModelSpec, table_dims: Sequence[int], local_batch: int) -> list[Operator]:
    """The operators of one step of ``execution.dense.DenseArch(table_dims, spec)`` on ``local_batch``
    samples, forward ones first: each linear layer (``(batch, in, out, relu)``), the
    interaction (``dot``: ``(batch, features, width)`` and the projections as linear layers;
    ``cat``: ``(batch, width out)``), the loss, and the optimizer step over the parameters
    (``(parameters, tensors)``)."""
    b = float(local_batch)
    feature_dim = max(table_dims)
    ops: list[Operator] = []

    def linears(sizes: Sequence[int], last_relu: bool, bias: bool = True) -> None:
        for i, (a, o) in enumerate(zip(sizes[:-1], sizes[1:])):
            relu = 1.0 if last_relu or i < len(sizes) - 2 else 0.0
            ops.append(Operator("linear", (b, float(a), float(o), relu), "layer"))

    linears([spec.dense_features, *spec.bottom_mlp, feature_dim], last_relu=True)
    n = len(table_dims) + 1
    if spec.interaction == "dot":
        for d in table_dims:
            if d != feature_dim:
                ops.append(Operator("linear", (b, float(d), float(feature_dim), 0.0), "layer"))
        ops.append(Operator("interaction_dot", (b, float(n), float(feature_dim)), "layer"))
        top_in = feature_dim + n * (n - 1) // 2
    else:
        top_in = feature_dim + sum(table_dims)
        ops.append(Operator("interaction_cat", (b, float(top_in)), "layer"))
    linears([top_in, *spec.top_mlp, 1], last_relu=False)
    ops.append(Operator("loss", (b,), "layer"))
    params, tensors = dense_parameters(spec, table_dims)
    ops.append(Operator("optimizer", (float(params), float(tensors)), "step"))
    return ops


def dense_parameters(spec: ModelSpec, table_dims: Sequence[int]) -> tuple[int, int]:
    """(parameters, parameter tensors) of ``DenseArch(table_dims, spec)``, counted without
    building it: what the dense gradients' all-reduce moves (4 bytes each) and what the
    optimizer steps over."""
    feature_dim = max(table_dims)
    n = len(table_dims) + 1
    params = tensors = 0
    sizes = [spec.dense_features, *spec.bottom_mlp, feature_dim]
    if spec.interaction == "dot":
        for d in table_dims:
            if d != feature_dim:
                params, tensors = params + d * feature_dim, tensors + 1
        top_in = feature_dim + n * (n - 1) // 2
    else:
        top_in = feature_dim + sum(table_dims)
    for layers in (sizes, [top_in, *spec.top_mlp, 1]):
        for a, o in zip(layers[:-1], layers[1:]):
            params, tensors = params + a * o + o, tensors + 2
    return params, tensors
