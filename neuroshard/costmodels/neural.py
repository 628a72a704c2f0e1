"""Neural cost models (the paper's pre-trained models), readable top to bottom.

**Compute** (``NeuralComputeModel``): a set model. Each shard's feature vector
(``features.FEATURE_NAMES`` plus a few log-scale and linear products) is normalised
and encoded by an MLP; the encodings of a set are summed (a fused kernel's cost is
not the sum of its shards', so the sum goes through a second MLP, the predictor) to
the log of the forward+backward ms. By default the predictor also sees the log of a
fitted analytic estimate and learns the log of measured / analytic (a residual): the
physics carries the scale, which matters when few tables were measured. Sets are
padded to a common length with a mask, so thousands of sets are one batched pass.

**Communication** (``NeuralCommModel``): one small MLP per direction (forward,
backward, reduce) that corrects the fitted analytic model multiplicatively:
``ms = analytic_ms * exp(mlp(inputs))``. Inputs per device are the bytes it sends
and receives, the peak bytes of the exchange, log2 of the device count and (forward)
its wait for the last device to start. The analytic part carries the scaling in
the device count; inputs are clipped to the range seen in training, so for 128
devices the correction stays bounded instead of extrapolating wildly.

Both train on log ms with Adam and early stopping on a validation split.
"""
from __future__ import annotations

import copy
import logging
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ..constants import MEASURED_BATCH_SIZE
from ..errors import NeuroShardError
from .analytic import (
    PEAK_BYTES,
    PEERS,
    REDUCE_BYTES,
    SEND_BYTES,
    AnalyticCommModel,
    AnalyticComputeModel,
    comm_terms,
    reduce_terms,
    wait_ms,
)
from .base import CommCostModel, CommSamples, ComputeCostModel, as_comm_groups, few_threads, pack_sets, register_model
from .features import FEATURE_NAMES, NUM_FEATURES

log = logging.getLogger(__name__)

_DIM, _POOL, _LOG_REUSE = (FEATURE_NAMES.index(n) for n in ("dim", "pooling_factor", "log2_mean_reuse"))


def mlp(num_inputs: int, hidden: int, depth: int, num_outputs: int | None = None) -> nn.Sequential:
    """``depth`` Linear+ReLU layers of width ``hidden`` (then a Linear to ``num_outputs`` if given)."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(num_inputs if i == 0 else hidden, hidden), nn.ReLU()]
    if num_outputs is not None:
        layers.append(nn.Linear(hidden if depth else num_inputs, num_outputs))
    return nn.Sequential(*layers)


def train_regressor(net: nn.Module, loss_of: Callable[[nn.Module, np.ndarray], torch.Tensor], num_train: int,
                    val_loss: Callable[[nn.Module], float], epochs: int, batch_size: int, lr: float,
                    weight_decay: float, patience: int, seed: int, desc: str,
                    lengths: np.ndarray | None = None) -> tuple[nn.Module, float]:
    """AdamW (cosine schedule) over shuffled mini-batches of ``num_train`` items; keeps the weights
    of the best validation loss and stops after ``patience`` epochs without improvement. With
    ``lengths`` (set sizes), each mini-batch holds sets of similar size (sorted within random
    chunks of 32 batches, batches shuffled), so ``loss_of`` can trim the padding."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1), eta_min=lr * 0.02)
    best, best_state, waited = float("inf"), copy.deepcopy(net.state_dict()), 0
    bar = tqdm(range(epochs), desc=desc, leave=False, disable=not log.isEnabledFor(logging.INFO))
    with few_threads():
        for _ in bar:
            net.train()
            order = rng.permutation(num_train)
            if lengths is not None:  # similar sizes together: sorted within chunks of 32 batches
                chunk = 32 * batch_size
                order = np.concatenate([part[np.argsort(lengths[part], kind="stable")]
                                        for part in np.split(order, range(chunk, num_train, chunk))])
            batches = [order[start:start + batch_size] for start in range(0, num_train, batch_size)]
            if lengths is not None:
                batches = [batches[i] for i in rng.permutation(len(batches))]
            for rows in batches:
                opt.zero_grad()
                loss_of(net, rows).backward()
                opt.step()
            sched.step()
            net.eval()
            with torch.no_grad():
                current = val_loss(net)
            bar.set_postfix(val=f"{current:.4f}", best=f"{min(best, current):.4f}")
            if current < best - 1e-5:
                best, best_state, waited = current, copy.deepcopy(net.state_dict()), 0
            else:
                waited += 1
                if waited >= patience:
                    break
    net.load_state_dict(best_state)
    net.eval()
    return net, best


# ------------------------------------------------------------------ compute
def shard_inputs(shards: np.ndarray) -> np.ndarray:
    """Per-shard model inputs: the named features plus ``EXTRA_INPUTS`` (log2 of width, lookups
    and bytes gathered; linear terms whose sums over a set are totals)."""
    dim, pool = shards[:, _DIM].astype(np.float64), shards[:, _POOL].astype(np.float64)
    distinct = pool / np.exp2(shards[:, _LOG_REUSE].astype(np.float64))
    # (a shard has dim >= 1; a zero row, e.g. a hand-made feature array, must not warn or give -inf)
    extra = np.stack([np.log2(np.maximum(dim, 1.0)), np.log2(pool + 1e-3), np.log2(pool * dim + 1e-3), np.log2(distinct * dim + 1e-3),
                      pool * dim / 256.0, distinct * dim / 256.0], 1)  # linear terms: sums over a set are totals
    return np.concatenate([shards.astype(np.float64), extra], axis=1).astype(np.float32)


#: the inputs ``shard_inputs`` appends to the named features, in order
EXTRA_INPUTS = ("log2_dim", "log2_pooling", "log2_lookup_width", "log2_distinct_width", "lookup_width_256",
                "distinct_width_256")
NUM_INPUTS = NUM_FEATURES + len(EXTRA_INPUTS)


def pad_sets(sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(S, M, NUM_INPUTS) raw inputs padded to the largest set, and (S, M) mask of real shards."""
    shards, index, num_sets = pack_sets(sets)
    sizes = np.bincount(index, minlength=num_sets)
    longest = max(int(sizes.max()) if num_sets else 0, 1)
    padded = np.zeros((num_sets, longest, NUM_INPUTS), np.float32)
    mask = np.zeros((num_sets, longest), np.float32)
    if len(shards):
        position = np.arange(len(index)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        padded[index, position] = shard_inputs(shards)
        mask[index, position] = 1.0
    return padded, mask


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of a 2-D array, the index of each row among them)."""
    if not len(rows):
        return rows, np.zeros(0, dtype=np.int64)
    rows = np.ascontiguousarray(rows)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, member = np.unique(keys, return_index=True, return_inverse=True)
    return rows[first], member.reshape(-1).astype(np.int64)


class Standardise(nn.Module):
    """``(z - mean) / std`` on the last axis, clipped to ``[lo, hi]``: the range seen in training,
    in standard units. The statistics are buffers, so they are saved with the network."""

    def __init__(self, num_inputs: int, dtype: torch.dtype):
        super().__init__()
        for name in ("mean", "std", "lo", "hi"):
            self.register_buffer(name, torch.zeros(num_inputs, dtype=dtype))

    def fit(self, z: np.ndarray) -> "Standardise":
        """Statistics and range of the rows of ``z``."""
        mean, std = z.mean(0), z.std(0) + 1e-6
        self._set(mean=mean, std=std, lo=(z.min(0) - mean) / std, hi=(z.max(0) - mean) / std)
        return self

    def widen(self, z: np.ndarray) -> None:
        """Widen the range to cover the rows of ``z`` too (the statistics stay)."""
        scaled = (z - self.mean.numpy()) / self.std.numpy()
        self._set(lo=np.minimum(self.lo.numpy(), scaled.min(0)), hi=np.maximum(self.hi.numpy(), scaled.max(0)))

    def _set(self, **values: np.ndarray) -> None:
        for name, value in values.items():
            getattr(self, name).copy_(torch.as_tensor(np.asarray(value)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.clamp((z - self.mean) / self.std, self.lo, self.hi)


def _standardise_v1(mean, std, lo, hi, dtype: torch.dtype) -> dict:
    """``Standardise`` buffers from a v1 checkpoint's mean, std and range (``lo``/``hi`` given in standard units)."""
    return {name: torch.as_tensor(np.asarray(value, dtype=np.float64).reshape(-1)).to(dtype)
            for name, value in (("mean", mean), ("std", std), ("lo", lo), ("hi", hi))}


#: the residual's statistics kept by ``SetNet`` (mean and std; range in log ms) before fitting
RESIDUAL_DEFAULTS = {"residual_mean": 0.0, "residual_std": 1.0, "residual_lo": -np.inf, "residual_hi": np.inf}


class SetNet(nn.Module):
    """Per-shard inputs, standardised -> encoder MLP -> masked sum over the set -> predictor MLP
    (beside the pooled encoding: the standardised log analytic ms, with a prior) -> the log of
    measured / analytic ms, clipped to the range seen in training. Normalisation is buffers."""

    def __init__(self, hidden: int, depth: int, prior: bool):
        super().__init__()
        self.shards = Standardise(NUM_INPUTS, torch.float32)
        self.prior = Standardise(1, torch.float64) if prior else None
        self.encoder = mlp(NUM_INPUTS, hidden, depth)
        self.predictor = mlp(hidden + int(prior), hidden, max(depth - 1, 1), 1)
        for name, value in RESIDUAL_DEFAULTS.items():
            self.register_buffer(name, torch.tensor(value, dtype=torch.float64))

    def fit_residual(self, residual: np.ndarray) -> np.ndarray:
        """Set the residual's statistics and range from training sets; their standardised residual."""
        stats = {"residual_mean": residual.mean(), "residual_std": residual.std() + 1e-6,
                 "residual_lo": residual.min(), "residual_hi": residual.max()}
        for name, value in stats.items():
            getattr(self, name).fill_(float(value))
        return self.standardise_residual(residual)

    def widen_residual(self, residual: np.ndarray) -> np.ndarray:
        """Widen the residual's range to cover ``residual``; its standardised values."""
        self.residual_lo.fill_(min(float(self.residual_lo), float(residual.min())))
        self.residual_hi.fill_(max(float(self.residual_hi), float(residual.max())))
        return self.standardise_residual(residual)

    def standardise_residual(self, residual: np.ndarray) -> np.ndarray:
        return (residual - float(self.residual_mean)) / float(self.residual_std)

    def inputs(self, padded: torch.Tensor, mask: torch.Tensor, log_prior: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(standardised shard inputs, zero where masked; per-set inputs)."""
        x = self.shards(padded) * mask.unsqueeze(-1)
        if self.prior is None:
            return x, x.new_zeros((len(log_prior), 0))
        return x, self.prior(log_prior.unsqueeze(-1)).float()

    def score(self, x: torch.Tensor, mask: torch.Tensor, set_inputs: torch.Tensor) -> torch.Tensor:
        """The standardised residual of each set from standardised inputs (what training fits)."""
        pooled = (self.encoder(x) * mask.unsqueeze(-1)).sum(dim=1)
        return self.predictor(torch.cat([pooled, set_inputs], dim=1)).squeeze(-1)

    def forward(self, padded: torch.Tensor, mask: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
        """log(measured / analytic ms) of each padded set (float64)."""
        x, set_inputs = self.inputs(padded, mask, log_prior)
        residual = self.score(x, mask, set_inputs).double() * self.residual_std + self.residual_mean
        return torch.clamp(residual, self.residual_lo, self.residual_hi)

    def forward_shared(self, shards: torch.Tensor, member: torch.Tensor, of_set: torch.Tensor,
                       log_prior: torch.Tensor) -> torch.Tensor:
        """``forward`` for sets that share shards: ``shards`` (U, NUM_INPUTS) are the distinct
        shards' raw inputs, encoded once each; set ``of_set[k]`` holds shard ``member[k]``.
        The encoder sees one shard at a time and the set's encoding is the sum of its shards',
        so this equals ``forward`` on the padded sets (up to float rounding), at the cost of
        one encoding per distinct shard instead of one per (set, shard) pair: a search asks
        about many sets of the same few thousand shards."""
        encoded = self.encoder(self.shards(shards))
        pooled = encoded.new_zeros((len(log_prior), encoded.shape[1]))
        pooled.index_add_(0, of_set, encoded[member])
        set_inputs = (self.prior(log_prior.unsqueeze(-1)).float() if self.prior is not None
                      else pooled.new_zeros((len(log_prior), 0)))
        score = self.predictor(torch.cat([pooled, set_inputs], dim=1)).squeeze(-1)
        residual = score.double() * self.residual_std + self.residual_mean
        return torch.clamp(residual, self.residual_lo, self.residual_hi)


@register_model
class NeuralComputeModel(ComputeCostModel):
    """Shard set -> fused forward+backward ms, a set network trained on log ms.

    With ``prior=True`` (the default) the network learns the log of measured / analytic
    ms (an ``AnalyticComputeModel`` fitted on the same data, ``prior_``), and sees the log
    analytic ms beside the pooled encoding: the physics carries the scale, the network what
    it misses. Fitted state: ``net_`` (a ``SetNet``, normalisation included), ``prior_``,
    ``val_loss_``."""

    name = "neural"

    def __init__(self, hidden: int = 128, depth: int = 3, lr: float = 2e-3, weight_decay: float = 1e-4,
                 epochs: int = 400, batch_size: int = 64, patience: int = 60, val_fraction: float = 0.15,
                 prior: bool = True, seed: int = 0):
        self.hidden = hidden
        self.depth = depth
        self.lr = lr
        self.weight_decay = weight_decay
        self.epochs = epochs
        self.batch_size = batch_size
        self.patience = patience
        self.val_fraction = val_fraction
        self.prior = prior
        self.seed = seed

    def _check(self) -> None:
        if getattr(self, "net_", None) is None:
            raise NeuroShardError("the neural compute model is not trained; call fit or load a checkpoint")

    def _inputs(self, sets: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(padded shard inputs, mask, log of the analytic prior's ms or zeros) of sets."""
        padded, mask = pad_sets(sets)
        return torch.from_numpy(padded), torch.from_numpy(mask), torch.from_numpy(self._log_prior(sets))

    def _log_prior(self, sets: Sequence[np.ndarray]) -> np.ndarray:
        """Log of the analytic prior's ms of each set (zeros without a prior)."""
        return np.zeros(len(sets)) if self.prior_ is None else np.log(np.maximum(self.prior_.predict(sets), 1e-6))

    def _training_data(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, fit: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(standardised inputs, mask, per-set inputs, standardised residual target) of measured sets;
        ``fit`` sets the residual's statistics from them, else widens its range to them."""
        padded, mask, log_prior = self._inputs(sets)
        residual = np.log(np.asarray(costs_ms, dtype=np.float64)) - log_prior.numpy()
        target = self.net_.fit_residual(residual) if fit else self.net_.widen_residual(residual)
        with torch.no_grad():
            x, set_inputs = self.net_.inputs(padded, mask, log_prior)
        return x, mask, set_inputs, torch.from_numpy(target.astype(np.float32))

    def _train(self, sets, costs_ms, val_sets, val_costs_ms, fit: bool, epochs: int, batch_size: int, lr: float,
               patience: int, desc: str) -> None:
        x, m, s, target = self._training_data(sets, costs_ms, fit)
        vpadded, vm, vlog_prior = self._inputs(val_sets)
        with torch.no_grad():
            vx, vs = self.net_.inputs(vpadded, vm, vlog_prior)
        vy = torch.from_numpy((np.log(np.asarray(val_costs_ms, dtype=np.float64)) - vlog_prior.numpy()).astype(np.float32))
        y_mean, y_std = float(self.net_.residual_mean), float(self.net_.residual_std)

        lengths = m.sum(dim=1).numpy().astype(np.int64)

        def loss_of(net: SetNet, rows: np.ndarray) -> torch.Tensor:
            r, longest = torch.from_numpy(rows), int(lengths[rows].max())  # padding beyond the batch's longest set cut
            return nn.functional.smooth_l1_loss(net.score(x[r, :longest], m[r, :longest], s[r]), target[r], beta=0.05)

        def val_loss(net: SetNet) -> float:  # mean |log(pred / true)|, about the mean relative error
            return float((net.score(vx, vm, vs) * y_std + y_mean - vy).abs().mean())

        self.net_, self.val_loss_ = train_regressor(self.net_, loss_of, len(sets), val_loss, epochs, batch_size, lr,
                                                    self.weight_decay, patience, self.seed, desc, lengths)

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray] | None = None,
            val_costs_ms: np.ndarray | None = None) -> "NeuralComputeModel":
        """Train; validation (early stopping) on ``val_sets`` or a random share of ``sets``."""
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        if len(sets) != len(costs_ms) or len(sets) < 4:
            raise NeuroShardError(f"need at least 4 measured shard sets with one cost each, got {len(sets)}")
        if val_sets is None:
            order = np.random.default_rng(self.seed).permutation(len(sets))
            cut = max(1, int(len(sets) * self.val_fraction))
            val_sets, val_costs_ms = [sets[i] for i in order[:cut]], costs_ms[order[:cut]]
            sets, costs_ms = [sets[i] for i in order[cut:]], costs_ms[order[cut:]]
        torch.manual_seed(self.seed)
        self.prior_ = AnalyticComputeModel().fit(sets, costs_ms) if self.prior else None
        self.net_ = SetNet(self.hidden, self.depth, self.prior_ is not None)
        padded, mask, log_prior = self._inputs(sets)
        self.net_.shards.fit(padded.numpy()[mask.numpy() > 0])
        if self.net_.prior is not None:
            self.net_.prior.fit(log_prior.numpy()[:, None])
        self._train(sets, costs_ms, val_sets, val_costs_ms, True, self.epochs, self.batch_size, self.lr,
                    self.patience, "compute model")
        return self

    def fine_tune(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray],
                  val_costs_ms: np.ndarray, epochs: int = 200, lr: float = 5e-4, patience: int = 40
                  ) -> "NeuralComputeModel":
        """Continue training the fitted network on new measurements (on-site calibration:
        other hardware, other tables). Normalisation and the analytic prior stay; the
        input, prior and residual ranges widen to cover the new sets, so shards and set
        sizes the pre-training never saw are no longer clipped away."""
        self._check()
        padded, mask, log_prior = self._inputs([*sets, *val_sets])
        self.net_.shards.widen(padded.numpy()[mask.numpy() > 0])
        if self.net_.prior is not None:
            self.net_.prior.widen(log_prior.numpy()[:, None])
        self._train(sets, costs_ms, val_sets, val_costs_ms, False, epochs, min(self.batch_size, max(8, len(sets) // 4)),
                    lr, patience, "calibration")
        return self

    @torch.no_grad()
    def predict(self, sets: Sequence[np.ndarray], chunk: int = 8192) -> np.ndarray:
        """ms of each shard set; the distinct shards of a chunk of sets are encoded once
        (``SetNet.forward_shared``)."""
        self._check()
        out = np.empty(len(sets))
        with few_threads():
            for start in range(0, len(sets), chunk):
                part = sets[start:start + chunk]
                shards, of_set, _ = pack_sets(part)
                log_prior = self._log_prior(part)
                distinct, member = _distinct_rows(shards)
                residual = self.net_.forward_shared(torch.from_numpy(shard_inputs(distinct)), torch.from_numpy(member),
                                                    torch.from_numpy(of_set), torch.from_numpy(log_prior))
                out[start:start + chunk] = log_prior + residual.numpy()
        return np.exp(out)

    def fitted_state(self) -> dict:
        if getattr(self, "net_", None) is None:
            return {}
        return {"net": self.net_.state_dict(), "prior": self.prior_.state_dict() if self.prior_ else None,
                "val_loss": float(self.val_loss_)}

    def load_fitted_state(self, state: dict) -> None:
        self.prior_ = AnalyticComputeModel.from_state_dict(state["prior"]) if state["prior"] else None
        self.net_ = SetNet(self.hidden, self.depth, self.prior_ is not None)
        self.net_.load_state_dict(state["net"])
        self.net_.eval()
        self.val_loss_ = float(state.get("val_loss", float("nan")))

    @classmethod
    def upgrade_v1(cls, state: dict) -> dict:
        """v1 kept the weights and a dozen normalisation fields side by side; they become the net's buffers."""
        net = dict(state["weights"])
        x_mean, x_std = np.asarray(state["x_mean"], np.float32), np.asarray(state["x_std"], np.float32)
        net.update({f"shards.{k}": v for k, v in _standardise_v1(
            x_mean, x_std, state.get("x_lo", np.full_like(x_mean, -np.inf)), state.get("x_hi", np.full_like(x_mean, np.inf)),
            torch.float32).items()})
        if state.get("prior"):
            net.update({f"prior.{k}": v for k, v in _standardise_v1(
                *state["prior_norm"], *state.get("prior_range", (-np.inf, np.inf)), torch.float64).items()})
        lo, hi = state.get("residual_range", (-np.inf, np.inf))
        for name, value in zip(RESIDUAL_DEFAULTS, (state["y_mean"], state["y_std"], lo, hi)):
            net[name] = torch.tensor(float(value), dtype=torch.float64)
        prior = AnalyticComputeModel.upgrade_v1(state["prior"]) if state.get("prior") else None
        return {"hparams": state["hparams"], "net": net, "prior": prior, "val_loss": state.get("val_loss", float("nan"))}


# -------------------------------------------------------------------- comm
def device_inputs(widths: np.ndarray, skews_ms: np.ndarray | None, batch_size: int) -> np.ndarray:
    """(P, D, K) per-device inputs: log of kB sent, received and at the peak, log2 devices (+ wait ms)."""
    terms = comm_terms(widths, batch_size)
    cols = [np.log1p(terms[..., SEND_BYTES:PEAK_BYTES + 1] / 1024.0), np.log2(terms[..., PEERS:PEERS + 1] + 1.0)]
    if skews_ms is not None:
        cols.append(np.log1p(wait_ms(skews_ms))[..., None])
    return np.concatenate(cols, axis=-1)


def reduce_inputs(reduce_width: np.ndarray, num_devices: int, batch_size: int) -> np.ndarray:
    """(P, 2) inputs of the reduction: log of kB per device, log2 devices."""
    terms = reduce_terms(reduce_width, num_devices, batch_size)
    return np.stack([np.log1p(terms[:, REDUCE_BYTES] / 1024.0), np.log2(terms[:, PEERS] + 1.0)], axis=1)


#: the communication directions, each with its own correction
DIRECTIONS = ("fwd", "bwd", "reduce")


class Correction(nn.Module):
    """A small MLP on standardised, clipped inputs giving log(measured / analytic ms)."""

    def __init__(self, num_inputs: int, hidden: int, depth: int):
        super().__init__()
        self.inputs = Standardise(num_inputs, torch.float64)
        self.mlp = mlp(num_inputs, hidden, depth, 1)

    def fit(self, z: np.ndarray, log_ratio: np.ndarray, val_z: np.ndarray, val_log_ratio: np.ndarray,
            desc: str, **training) -> "Correction":
        """Train on per-device inputs ``z``; ``training``: ``train_regressor``'s settings."""
        self.inputs.fit(z)
        nn.init.zeros_(self.mlp[-1].weight)  # start as the analytic model
        nn.init.zeros_(self.mlp[-1].bias)
        x, y = self.inputs(torch.from_numpy(z)).float(), torch.from_numpy(log_ratio.astype(np.float32))
        vx, vy = self.inputs(torch.from_numpy(val_z)).float(), torch.from_numpy(val_log_ratio.astype(np.float32))

        def loss_of(net: nn.Module, rows: np.ndarray) -> torch.Tensor:
            rows_t = torch.from_numpy(rows)
            return nn.functional.smooth_l1_loss(net(x[rows_t]).squeeze(-1), y[rows_t], beta=0.05)

        def val_loss(net: nn.Module) -> float:
            return float((net(vx).squeeze(-1) - vy).abs().mean())

        self.mlp, _ = train_regressor(self.mlp, loss_of, len(z), val_loss, desc=desc, **training)
        return self

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.inputs(z).float()).squeeze(-1).double()

    @torch.no_grad()
    def predict(self, z: np.ndarray) -> np.ndarray:
        """(..., K) inputs -> (...) log(measured / analytic ms)."""
        with few_threads():
            out = self(torch.from_numpy(np.asarray(z, dtype=np.float64).reshape(-1, z.shape[-1]))).numpy()
        return out.reshape(z.shape[:-1])


@register_model
class NeuralCommModel(CommCostModel):
    """Per-device communication ms: the analytic model (``analytic_``) times a learned correction
    per direction (``fwd_``, ``bwd_``, ``reduce_``; None where nothing was measured). ``batch_size``
    is the batch the costs are for, ``train_batch_size`` the mini-batch of training."""

    name = "neural"

    def __init__(self, batch_size: int = MEASURED_BATCH_SIZE, hidden: int = 32, depth: int = 2, lr: float = 3e-3,
                 weight_decay: float = 1e-4, epochs: int = 300, train_batch_size: int = 256, patience: int = 30,
                 val_fraction: float = 0.15, seed: int = 0):
        self.batch_size = batch_size
        self.hidden = hidden
        self.depth = depth
        self.lr = lr
        self.weight_decay = weight_decay
        self.epochs = epochs
        self.train_batch_size = train_batch_size
        self.patience = patience
        self.val_fraction = val_fraction
        self.seed = seed

    def fit(self, samples: CommSamples | Sequence[CommSamples],
            val_samples: CommSamples | Sequence[CommSamples] | None = None) -> "NeuralCommModel":
        groups = as_comm_groups(samples)
        if val_samples is None:
            rng = np.random.default_rng(self.seed)
            splits = [np.split(rng.permutation(len(g)), [max(1, int(len(g) * self.val_fraction))]) for g in groups]
            val_groups = [g.subset(v) for g, (v, _) in zip(groups, splits)]
            groups = [g.subset(t) for g, (_, t) in zip(groups, splits)]
        else:
            val_groups = as_comm_groups(val_samples)
        torch.manual_seed(self.seed)
        self.analytic_ = AnalyticCommModel(self.batch_size).fit(groups)
        training = dict(epochs=self.epochs, batch_size=self.train_batch_size, lr=self.lr,
                        weight_decay=self.weight_decay, patience=self.patience, seed=self.seed)

        def data(gs: list[CommSamples], direction: str) -> tuple[np.ndarray, np.ndarray]:
            z, r = [], []
            for g in gs:
                if direction == "fwd":
                    zi = device_inputs(g.widths, g.skews_ms, self.batch_size)
                    base, true = self.analytic_.predict_forward(g.widths, g.skews_ms), g.fwd_ms
                elif direction == "bwd":
                    zi = device_inputs(g.widths, None, self.batch_size)
                    base, true = self.analytic_.predict_backward(g.widths), g.bwd_ms
                else:
                    g = g.reducing()
                    zi = reduce_inputs(g.reduce_width, g.num_devices, self.batch_size)
                    base, true = self.analytic_.predict_reduce(g.reduce_width, g.num_devices), g.reduce_ms_per_sample
                z.append(zi.reshape(-1, zi.shape[-1]).astype(np.float64))
                r.append(np.log(np.maximum(true, 1e-6) / np.maximum(base, 1e-6)).ravel())
            return (np.concatenate(z) if z else np.zeros((0, 2))), (np.concatenate(r) if r else np.zeros(0))

        for direction in DIRECTIONS:
            train_z, train_r = data(groups, direction)
            val_z, val_r = data(val_groups, direction)
            correction = None
            if len(train_r) >= 4 and len(val_r) >= 1:  # else nothing measured (no row-wise reduction): analytic only
                correction = Correction(train_z.shape[1], self.hidden, self.depth).fit(
                    train_z, train_r, val_z, val_r, f"comm {direction} model", **training)
            setattr(self, f"{direction}_", correction)
        return self

    def _check(self) -> None:
        if getattr(self, "analytic_", None) is None or not self.analytic_.fitted:
            raise NeuroShardError("the neural comm model is not trained; call fit or load a checkpoint")

    def _correct(self, direction: str, analytic_ms: np.ndarray, z: np.ndarray) -> np.ndarray:
        correction = getattr(self, f"{direction}_")
        return analytic_ms * np.exp(correction.predict(z) if correction is not None else 0.0)

    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        self._check()
        return self._correct("fwd", self.analytic_.predict_forward(widths, skews_ms),
                             device_inputs(widths, skews_ms, self.batch_size))

    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        self._check()
        return self._correct("bwd", self.analytic_.predict_backward(widths), device_inputs(widths, None, self.batch_size))

    def predict_reduce(self, reduce_width: np.ndarray, num_devices: int) -> np.ndarray:
        self._check()
        return self._correct("reduce", self.analytic_.predict_reduce(reduce_width, num_devices),
                             reduce_inputs(reduce_width, num_devices, self.batch_size))

    def fitted_state(self) -> dict:
        if getattr(self, "analytic_", None) is None:
            return {}
        corrections = {d: getattr(self, f"{d}_") for d in DIRECTIONS}
        return {"analytic": self.analytic_.state_dict(),
                **{d: c.state_dict() if c is not None else None for d, c in corrections.items()}}

    def load_fitted_state(self, state: dict) -> None:
        self.analytic_ = AnalyticCommModel.from_state_dict(state["analytic"])
        for d in DIRECTIONS:
            correction = None
            if state[d] is not None:
                correction = Correction(len(state[d]["inputs.mean"]), self.hidden, self.depth)
                correction.load_state_dict(state[d])
                correction.eval()
            setattr(self, f"{d}_", correction)

    @classmethod
    def upgrade_v1(cls, state: dict) -> dict:
        """v1 named the mini-batch ``hparams.batch_size`` and kept each correction's statistics beside its MLP."""
        hparams = dict(state["hparams"])
        hparams["train_batch_size"] = hparams.pop("batch_size")
        hparams["batch_size"] = state["batch_size"]

        def correction(s: dict | None) -> dict | None:
            if not s:
                return None
            mean, std = np.asarray(s["mean"], np.float64), np.asarray(s["std"], np.float64)
            lo, hi = ((np.asarray(s[k], np.float64) - mean) / std for k in ("lo", "hi"))
            return {**{f"mlp.{k}": v for k, v in s["weights"].items()},
                    **{f"inputs.{k}": v for k, v in _standardise_v1(mean, std, lo, hi, torch.float64).items()}}

        return {"hparams": hparams, "analytic": AnalyticCommModel.upgrade_v1(state["analytic"]),
                **{d: correction(state[d]) for d in DIRECTIONS}}
