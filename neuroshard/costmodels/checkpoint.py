"""One checkpoint file per ``CostModels`` bundle: ``torch.save`` of a plain dict.

The dict holds the feature schema (``FEATURE_SCHEMA_VERSION``, ``FEATURE_NAMES``),
each model's class name and ``state_dict`` (``hparams``: the constructor's arguments;
then the fitted state: weights with their normalisation buffers, fitted constants,
trees as arrays), the hardware fingerprint of the measurements (``meta.json``), the
batch size, a summary of the training data and the held-out metrics. It loads with
``torch.load(weights_only=True)``: only tensors, numbers, strings, lists and dicts;
a model is built by its constructor from ``hparams``, then given its fitted state.
Format v1 files (normalisation as loose fields, trees pickled) read through each
class's ``upgrade_v1``; v1 tree models are refused (a pickle is code, not data).

Every file written carries ``checksum``: ``sha256:`` and the SHA-256 of the rest of the
dict in a canonical form (``state_checksum``: each tensor's name, dtype, shape and bytes in
key order, then the JSON of everything else), computed the same way on save and on load. A
file whose contents no longer match is refused as damaged (a zeroed block, overwritten
weights: they would otherwise load and move every estimate), once its contents have passed
their own checks (a malformed field, or models predicting NaN, is the more useful line); a
file written before checksums loads with a note, once per file in a process.

Model classes register themselves under their class name, the name checkpoints store
(``register_model``, a class decorator, also in ``base``): the package's classes where
they are defined, a user's class in the user's module (imported before its checkpoint is
read).
"""
from __future__ import annotations

import hashlib
import importlib
import io
import json
import logging
import math
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..constants import SHIPPED_CHECKPOINTS
from ..errors import NeuroShardError, os_reason
from ..io import atomic_write_bytes
from ..validate import read_bounded
from .features import FEATURE_NAMES, FEATURE_SCHEMA_VERSION

if TYPE_CHECKING:  # the models are read by duck typing; base builds the bundle from load_parts
    from .base import CommCostModel, ComputeCostModel, CostModels

log = logging.getLogger(__name__)

#: the largest checkpoint read (the shipped one is under 1 MB; ensembles of big MLPs stay far below)
MAX_CHECKPOINT_BYTES = 2**30

CHECKPOINT_FORMAT = "neuroshard.costmodels/v2"
#: the field holding ``"sha256:" + state_checksum(the rest)``
CHECKSUM_FIELD = "checksum"
CHECKSUM_PREFIX = "sha256:"
#: the older format still read (each model's state upgraded by its class)
CHECKPOINT_FORMAT_V1 = "neuroshard.costmodels/v1"
#: the package's modules whose model classes register themselves, imported in this order
#: (lightest first) only until a checkpoint's class is found: reading a checkpoint imports
#: no model library it does not need (the trees' scikit-learn ensemble)
MODEL_MODULES = ("neuroshard.costmodels.analytic", "neuroshard.costmodels.work", "neuroshard.costmodels.neural",
                 "neuroshard.costmodels.ensemble", "neuroshard.costmodels.tree")

_Model = TypeVar("_Model", bound=type)
#: checkpoint name (the class name) -> registered model class
_REGISTRY: dict[str, type] = {}


def register_model(cls: _Model) -> _Model:
    """Class decorator: checkpoints save ``cls`` (a ``base.CostModel`` with ``fitted_state`` /
    ``load_fitted_state``) under its class name and load it back by that name."""
    name = getattr(cls, "__name__", None)
    if not isinstance(cls, type) or not all(callable(getattr(cls, m, None)) for m in ("state_dict", "from_state_dict")):
        raise NeuroShardError(f"a cost model class needs state_dict and from_state_dict, got {cls!r}")
    known = _REGISTRY.get(name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise NeuroShardError(f"cost model class {name!r} is already registered (from {known.__module__})")
    _REGISTRY[name] = cls  # the same class again (its module reloaded) replaces itself
    return cls


def model_class(name: str) -> type | None:
    """The model class registered as ``name``, the package's model modules imported (in
    ``MODEL_MODULES``' order) until it is; None when no module registers it."""
    for module in MODEL_MODULES:
        if name in _REGISTRY:
            break
        importlib.import_module(module)
    return _REGISTRY.get(name)


class _RegisteredModels(Mapping):
    """Read-only view of the registry, name -> class, with every package model imported."""

    def _all(self) -> dict[str, type]:
        for module in MODEL_MODULES:
            importlib.import_module(module)
        return _REGISTRY

    def __getitem__(self, name: str) -> type:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._all()))

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"MODEL_CLASSES({sorted(self._all())})"


#: every registered model class by checkpoint name (read-only; add one with ``register_model``)
MODEL_CLASSES: Mapping[str, type] = _RegisteredModels()


def plain(value: Any) -> Any:
    """Numbers, strings, lists and dicts only (numpy scalars/arrays converted), for weights_only loads."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def model_entry(model: ComputeCostModel | CommCostModel) -> dict:
    name = type(model).__name__
    registered = model_class(name)
    if registered is None or not isinstance(model, registered):  # it loads back as the class of its name
        raise NeuroShardError(f"cannot checkpoint a {name}: not one of {sorted(MODEL_CLASSES)} "
                              f"(a class registers with costmodels.base.register_model)")
    state = model.state_dict()
    return {"class": name, "state": {**state, "hparams": plain(state["hparams"])}}


def model_from_entry(entry: dict, where: str, fmt: str = CHECKPOINT_FORMAT) -> Any:
    if not isinstance(entry, dict):
        raise NeuroShardError(f"{where}: a model entry must be a dict with 'class' and 'state'")
    name = entry.get("class")
    cls = model_class(name) if isinstance(name, str) else None
    if cls is None:
        raise NeuroShardError(f"{where}: unknown cost model class {name!r}")
    if not isinstance(entry.get("state"), dict):
        raise NeuroShardError(f"{where}: {name}: field 'state' must be a dict")
    try:
        state = cls.upgrade_v1(entry["state"]) if fmt == CHECKPOINT_FORMAT_V1 else entry["state"]
        if not isinstance(state.get("hparams"), dict):
            raise KeyError("hparams")
        model = cls.from_state_dict(state)
    except NeuroShardError as exc:
        raise NeuroShardError(f"{where}: {name}: {exc}") from None
    except KeyError as exc:
        raise NeuroShardError(f"{where}: {name}: field 'state.{exc.args[0]}' is missing") from None
    except (TypeError, ValueError, RuntimeError, AttributeError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NeuroShardError(f"{where}: {name}: malformed model state ({type(exc).__name__}: {first[:200]})") from None
    return model


def _canonical(value: Any, name: str, digest: Any) -> Any:
    """``value`` with every tensor replaced by its name, dtype and shape (its bytes fed to
    ``digest`` in the order met: dict keys sorted); dict keys as their JSON text."""
    import torch
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        header = json.dumps([name, str(tensor.dtype), list(tensor.shape)])
        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        digest.update(f"{len(header)}:{header}{len(data)}:".encode())
        digest.update(data)
        return {"tensor": name, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}
    if isinstance(value, dict):
        keys = {json.dumps(k, default=repr): k for k in value}
        return {text: _canonical(value[keys[text]], f"{name}/{text}", digest) for text in sorted(keys)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{name}[{i}]", digest) for i, v in enumerate(value)]
    return value


def state_checksum(payload: Mapping) -> str:
    """``sha256:<hex>`` of ``payload`` without its ``checksum`` field: every tensor's name
    (its path of keys), dtype, shape and bytes in sorted-key order, then the JSON of the
    non-tensor fields (tensors shown by name, dtype and shape)."""
    digest = hashlib.sha256()
    rest = {k: v for k, v in payload.items() if k != CHECKSUM_FIELD}
    skeleton = _canonical(rest, "", digest)
    digest.update(json.dumps(skeleton, sort_keys=True, separators=(",", ":"), default=repr).encode())
    return CHECKSUM_PREFIX + digest.hexdigest()


#: checkpoints read without a checksum in this process (the note about them is given once)
_NOTED_UNCHECKED: set[str] = set()


def check_checksum(payload: dict, path: str | Path) -> None:
    """NeuroShardError naming ``path`` when ``payload``'s stored checksum is not its own; a
    payload without one (written before checksums) passes with a note, once per file."""
    stored = payload.get(CHECKSUM_FIELD)
    if stored is None:
        key = str(Path(path).resolve())
        if key not in _NOTED_UNCHECKED:
            _NOTED_UNCHECKED.add(key)
            log.warning("%s: this checkpoint carries no checksum (written before checksums), so damage to it "
                        "would go unnoticed; saving it again adds one (CostModels.load(path).save(path))", path)
        return
    try:
        computed = state_checksum(payload)
    except (TypeError, ValueError, RuntimeError) as exc:  # a tensor of a kind no checkpoint holds (sparse, quantized)
        raise NeuroShardError(f"{path}: not a cost-model checkpoint ({type(exc).__name__} reading its "
                              f"contents)") from None
    if stored != computed:
        shown = f"stored {stored[:19]}..." if isinstance(stored, str) else f"stored a {type(stored).__name__}"
        raise NeuroShardError(f"{path}: checksum mismatch: the file is damaged ({shown}, contents {computed[:19]}...); "
                              f"pre-train or calibrate it again, or restore it from a copy")


def _torch_load(data: bytes) -> Any:
    """``torch.load(weights_only=True)`` of ``data`` on CPU, without torch's warning about a
    pickle protocol it does not expect (a file that is not a checkpoint gets our one line)."""
    import torch
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def save_cost_models(models: CostModels, path: str | Path) -> Path:
    """Write ``models`` to ``path`` atomically (a crash leaves the old file or the new one)."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "feature_names": list(FEATURE_NAMES),
        "name": models.name,
        "batch_size": int(models.batch_size),
        "hardware": plain(models.hardware),
        "data_summary": plain(models.data_summary),
        "metrics": plain(models.metrics),
        "compute": model_entry(models.compute),
        "comm": model_entry(models.comm),
    }
    import torch  # heavy: only when a checkpoint is written or read
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    try:  # what is written must be data: refuse to write a file that would need unpickling to read
        loaded = _torch_load(buffer.getvalue())
    except Exception as exc:
        raise NeuroShardError(f"cannot checkpoint cost models '{models.name}': their state is not plain data "
                              f"({type(exc).__name__})") from None
    # The checksum of what a load will see (tensors on CPU, as read back), stored with it.
    payload[CHECKSUM_FIELD] = state_checksum(loaded)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    if state_checksum(_torch_load(buffer.getvalue())) != payload[CHECKSUM_FIELD]:  # a load must find the same
        raise NeuroShardError(f"cannot checkpoint cost models '{models.name}': their checksum is not the same "
                              f"once read back")
    path = atomic_write_bytes(path, buffer.getvalue())
    log.info("wrote cost models %s (%.1f kB)", path, path.stat().st_size / 1024)
    return path


def shipped_checkpoint(path: str | Path) -> Path:
    """``path``, or the shipped checkpoint it names (``cpu-default``: what every search prints
    as its cost model's name) when no such file exists and it is a bare name."""
    path = Path(path)
    shipped = SHIPPED_CHECKPOINTS / f"{path.name}.pt"
    if not path.exists() and str(path) == path.name and not path.suffix and shipped.exists():
        return shipped
    return path


def read_checkpoint(path: str | Path) -> dict:
    """The raw checkpoint dict, after checking its format and feature schema (its checksum is
    checked by ``load_parts``, once its models are built). A bare name (``cpu-default``) reads
    the shipped checkpoint of that name."""
    path = shipped_checkpoint(path)
    if not path.exists():
        raise NeuroShardError(f"{path}: no such cost-model checkpoint")
    try:
        raw = read_bounded(path, MAX_CHECKPOINT_BYTES, "cost-model checkpoint", text=False)
    except OSError as exc:
        raise NeuroShardError(f"{path}: cannot read the cost-model checkpoint ({os_reason(exc)})") from None
    try:
        payload = _torch_load(raw)
    except Exception as exc:  # torch raises many kinds for a file that is not a checkpoint
        import pickle
        # a torch file (a zip) that torch cannot read, rather than a pickle of something else
        damaged = raw[:4] == b"PK\x03\x04" and not isinstance(exc, pickle.UnpicklingError)
        raise NeuroShardError(f"{path}: not a cost-model checkpoint" + (
            f", or a damaged one ({type(exc).__name__}); pre-train or calibrate it again, or restore it from a copy"
            if damaged else f" ({type(exc).__name__})")) from None
    if not isinstance(payload, dict) or payload.get("format") not in (CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_V1):
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise NeuroShardError(f"{path}: format is {found!r}; this version of neuroshard reads {CHECKPOINT_FORMAT!r}")
    version = payload.get("feature_schema_version")
    if version != FEATURE_SCHEMA_VERSION:
        raise NeuroShardError(f"{path}: feature schema version {version} but this neuroshard uses version "
                              f"{FEATURE_SCHEMA_VERSION}; re-train it with `neuroshard pretrain`")
    if not isinstance(payload.get("feature_names", ()), (list, tuple)) or \
            tuple(payload.get("feature_names", ())) != FEATURE_NAMES:
        raise NeuroShardError(f"{path}: feature names differ from this neuroshard's (same schema version "
                              f"{version}); re-train it with `neuroshard pretrain`")
    batch_size = payload.get("batch_size")
    if not (isinstance(batch_size, int) and not isinstance(batch_size, bool) and 1 <= batch_size <= 2**20):
        raise NeuroShardError(f"{path}: field 'batch_size' must be an integer in [1, {2**20}], got {batch_size!r}")
    if not isinstance(payload.get("name", ""), str):
        raise NeuroShardError(f"{path}: field 'name' must be a string, got {payload.get('name')!r}")
    for key in ("compute", "comm"):
        entry = payload.get(key)
        if not isinstance(entry, dict) or not isinstance(entry.get("class"), str) or \
                not isinstance(entry.get("state"), dict):
            raise NeuroShardError(f"{path}: field '{key}' must be a dict with 'class' and 'state'")
    for key in ("hardware", "data_summary", "metrics"):
        if not isinstance(payload.get(key, {}), dict):
            raise NeuroShardError(f"{path}: field '{key}' must be a dict, got {type(payload.get(key)).__name__}")
    if not all(isinstance(v, dict) for v in payload.get("metrics", {}).values()):
        raise NeuroShardError(f"{path}: field 'metrics' must map names to dicts of numbers")
    return payload


def load_parts(path: str | Path, payload: dict | None = None) -> dict:
    """The keyword arguments of ``CostModels`` read from a checkpoint written by
    ``save_cost_models`` (``CostModels.load`` builds the bundle from them, checks its
    predictions, then the file's checksum: ``check_checksum``); ``payload``:
    ``read_checkpoint(path)``'s dict when the caller has read it already."""
    payload = read_checkpoint(path) if payload is None else payload
    fmt = payload["format"]
    parts = dict(compute=model_from_entry(payload["compute"], str(path), fmt),
                 comm=model_from_entry(payload["comm"], str(path), fmt),
                 batch_size=int(payload["batch_size"]), hardware=payload.get("hardware", {}),
                 name=payload.get("name", Path(path).stem), metrics=payload.get("metrics", {}),
                 data_summary=payload.get("data_summary", {}), path=Path(path))
    return parts
