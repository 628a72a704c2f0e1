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

from ..errors import NeuroShardError
from .analytic import (PEAK_BYTES, PEERS, REDUCE_BYTES, SEND_BYTES, AnalyticCommModel, AnalyticComputeModel,
                       comm_terms, reduce_terms, wait_ms)
from .base import CommCostModel, CommSamples, ComputeCostModel, as_comm_groups, few_threads, pack_sets
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
                    weight_decay: float, patience: int, seed: int, desc: str) -> tuple[nn.Module, float]:
    """AdamW (cosine schedule) over shuffled mini-batches of ``num_train`` items; keeps the weights
    of the best validation loss and stops after ``patience`` epochs without improvement."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1), eta_min=lr * 0.02)
    best, best_state, waited = float("inf"), copy.deepcopy(net.state_dict()), 0
    bar = tqdm(range(epochs), desc=desc, leave=False, disable=not log.isEnabledFor(logging.INFO))
    with few_threads():
        for _ in bar:
            net.train()
            order = rng.permutation(num_train)
            for start in range(0, num_train, batch_size):
                opt.zero_grad()
                loss_of(net, order[start:start + batch_size]).backward()
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
    extra = np.stack([np.log2(dim), np.log2(pool + 1e-3), np.log2(pool * dim + 1e-3), np.log2(distinct * dim + 1e-3),
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


class SetNet(nn.Module):
    """Per-shard encoder MLP, masked sum over the set, predictor MLP -> one number per set.
    ``num_set_inputs`` per-set numbers (the analytic prior) join the pooled encoding."""

    def __init__(self, num_inputs: int, hidden: int, depth: int, num_set_inputs: int = 0):
        super().__init__()
        self.encoder = mlp(num_inputs, hidden, depth)
        self.predictor = mlp(hidden + num_set_inputs, hidden, max(depth - 1, 1), 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, set_inputs: torch.Tensor) -> torch.Tensor:
        pooled = (self.encoder(x) * mask.unsqueeze(-1)).sum(dim=1)
        return self.predictor(torch.cat([pooled, set_inputs], dim=1)).squeeze(-1)


class NeuralComputeModel(ComputeCostModel):
    """Shard set -> fused forward+backward ms, a set network trained on log ms.

    With ``prior=True`` (the default) the network learns the log of measured / analytic
    ms (an ``AnalyticComputeModel`` fitted on the same data), and sees the log analytic ms
    beside the pooled encoding: the physics carries the scale, the network what it misses."""

    name = "neural"

    def __init__(self, hidden: int = 128, depth: int = 3, lr: float = 2e-3, weight_decay: float = 1e-4,
                 epochs: int = 400, batch_size: int = 64, patience: int = 60, val_fraction: float = 0.15,
                 prior: bool = True, seed: int = 0):
        self.hparams = dict(hidden=hidden, depth=depth, lr=lr, weight_decay=weight_decay, epochs=epochs,
                            batch_size=batch_size, patience=patience, val_fraction=val_fraction, prior=prior,
                            seed=seed)
        self.prior: AnalyticComputeModel | None = None
        self.net: SetNet | None = None
        self.x_mean = self.x_std = None
        self.y_mean, self.y_std = 0.0, 1.0
        self.val_loss = float("nan")

    def _inputs(self, sets: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
        """Network inputs of sets: (shard inputs, mask, per-set inputs, log prior ms added to the output)."""
        padded, mask = pad_sets(sets)
        # Clipped to the range seen in training: a set model must not extrapolate wildly on
        # shards unlike any it was trained on (the analytic prior carries those).
        x = np.clip((padded - self.x_mean) / self.x_std, self.x_lo, self.x_hi) * mask[..., None]
        if self.prior is None:
            base = np.zeros(len(sets))
            set_inputs = np.zeros((len(sets), 0))
        else:
            base = np.log(np.maximum(self.prior.predict(sets), 1e-6))
            set_inputs = np.clip((base - self.prior_mean) / self.prior_std, *self.prior_range)[:, None]
        return (torch.from_numpy(x.astype(np.float32)), torch.from_numpy(mask),
                torch.from_numpy(set_inputs.astype(np.float32)), base)

    def fit(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray] | None = None,
            val_costs_ms: np.ndarray | None = None) -> "NeuralComputeModel":
        """Train; validation (early stopping) on ``val_sets`` or a random share of ``sets``."""
        hp = self.hparams
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        if len(sets) != len(costs_ms) or len(sets) < 4:
            raise NeuroShardError(f"need at least 4 measured shard sets with one cost each, got {len(sets)}")
        if val_sets is None:
            order = np.random.default_rng(hp["seed"]).permutation(len(sets))
            cut = max(1, int(len(sets) * hp["val_fraction"]))
            val_sets, val_costs_ms = [sets[i] for i in order[:cut]], costs_ms[order[:cut]]
            sets, costs_ms = [sets[i] for i in order[cut:]], costs_ms[order[cut:]]
        torch.manual_seed(hp["seed"])
        padded, mask = pad_sets(sets)
        real = padded[mask > 0]
        self.x_mean, self.x_std = real.mean(0), real.std(0) + 1e-6
        self.x_lo, self.x_hi = (real.min(0) - self.x_mean) / self.x_std, (real.max(0) - self.x_mean) / self.x_std
        self.prior_range = (-np.inf, np.inf)
        self.prior = AnalyticComputeModel().fit(sets, costs_ms) if hp.get("prior", True) else None
        if self.prior is not None:
            log_prior = np.log(np.maximum(self.prior.predict(sets), 1e-6))
            self.prior_mean, self.prior_std = float(log_prior.mean()), float(log_prior.std() + 1e-6)
            normed = (log_prior - self.prior_mean) / self.prior_std
            self.prior_range = (float(normed.min()), float(normed.max()))
        x, m, s, base = self._inputs(sets)
        residual = np.log(costs_ms) - base
        self.residual_range = (float(residual.min()), float(residual.max()))
        self.y_mean, self.y_std = float(residual.mean()), float(residual.std() + 1e-6)
        target = torch.from_numpy(((residual - self.y_mean) / self.y_std).astype(np.float32))
        vx, vm, vs, vbase = self._inputs(val_sets)
        vy = torch.from_numpy((np.log(np.asarray(val_costs_ms, dtype=np.float64)) - vbase).astype(np.float32))
        self.net = SetNet(NUM_INPUTS, hp["hidden"], hp["depth"], s.shape[1])

        def loss_of(net: nn.Module, rows: np.ndarray) -> torch.Tensor:
            r = torch.from_numpy(rows)
            return nn.functional.smooth_l1_loss(net(x[r], m[r], s[r]), target[r], beta=0.05)

        def val_loss(net: nn.Module) -> float:  # mean |log(pred / true)|, about the mean relative error
            return float((net(vx, vm, vs) * self.y_std + self.y_mean - vy).abs().mean())

        self.net, self.val_loss = train_regressor(self.net, loss_of, len(sets), val_loss, hp["epochs"],
                                                  hp["batch_size"], hp["lr"], hp["weight_decay"], hp["patience"],
                                                  hp["seed"], "compute model")
        return self

    def fine_tune(self, sets: Sequence[np.ndarray], costs_ms: np.ndarray, val_sets: Sequence[np.ndarray],
                  val_costs_ms: np.ndarray, epochs: int = 200, lr: float = 5e-4, patience: int = 40
                  ) -> "NeuralComputeModel":
        """Continue training the fitted network on new measurements (on-site calibration:
        other hardware, other tables). Normalisation and the analytic prior stay; the
        input, prior and residual ranges widen to cover the new sets, so shards and set
        sizes the pre-training never saw are no longer clipped away."""
        if self.net is None:
            raise NeuroShardError("the neural compute model is not trained; call fit or load a checkpoint")
        hp = self.hparams
        costs_ms = np.asarray(costs_ms, dtype=np.float64)
        padded, mask = pad_sets([*sets, *val_sets])
        real = (padded[mask > 0] - self.x_mean) / self.x_std
        self.x_lo, self.x_hi = np.minimum(self.x_lo, real.min(0)), np.maximum(self.x_hi, real.max(0))
        if self.prior is not None:
            log_prior = np.log(np.maximum(self.prior.predict([*sets, *val_sets]), 1e-6))
            normed = (log_prior - self.prior_mean) / self.prior_std
            self.prior_range = (min(self.prior_range[0], float(normed.min())),
                                max(self.prior_range[1], float(normed.max())))
        x, m, s, base = self._inputs(sets)
        residual = np.log(costs_ms) - base
        self.residual_range = (min(self.residual_range[0], float(residual.min())),
                               max(self.residual_range[1], float(residual.max())))
        target = torch.from_numpy(((residual - self.y_mean) / self.y_std).astype(np.float32))
        vx, vm, vs, vbase = self._inputs(val_sets)
        vy = torch.from_numpy((np.log(np.asarray(val_costs_ms, dtype=np.float64)) - vbase).astype(np.float32))

        def loss_of(net: nn.Module, rows: np.ndarray) -> torch.Tensor:
            r = torch.from_numpy(rows)
            return nn.functional.smooth_l1_loss(net(x[r], m[r], s[r]), target[r], beta=0.05)

        def val_loss(net: nn.Module) -> float:
            return float((net(vx, vm, vs) * self.y_std + self.y_mean - vy).abs().mean())

        self.net, self.val_loss = train_regressor(self.net, loss_of, len(sets), val_loss, epochs,
                                                  min(hp["batch_size"], max(8, len(sets) // 4)), lr,
                                                  hp["weight_decay"], patience, hp["seed"], "calibration")
        return self

    @torch.no_grad()
    def predict(self, sets: Sequence[np.ndarray], chunk: int = 8192) -> np.ndarray:
        if self.net is None:
            raise NeuroShardError("the neural compute model is not trained; call fit or load a checkpoint")
        out = np.empty(len(sets))
        with few_threads():
            for start in range(0, len(sets), chunk):
                x, m, s, base = self._inputs(sets[start:start + chunk])
                residual = self.net(x, m, s).double().numpy() * self.y_std + self.y_mean
                out[start:start + chunk] = base + np.clip(residual, *self.residual_range)
        return np.exp(out)

    def state_dict(self) -> dict:
        return {"hparams": dict(self.hparams), "weights": self.net.state_dict() if self.net else None,
                "x_mean": self.x_mean.tolist(), "x_std": self.x_std.tolist(), "y_mean": self.y_mean,
                "y_std": self.y_std, "x_lo": self.x_lo.tolist(), "x_hi": self.x_hi.tolist(),
                "prior_range": list(self.prior_range), "residual_range": list(self.residual_range),
                "val_loss": float(self.val_loss), "num_inputs": NUM_INPUTS,
                "prior": self.prior.state_dict() if self.prior else None,
                "prior_norm": [self.prior_mean, self.prior_std] if self.prior else None}

    def load_state_dict(self, state: dict) -> None:
        self.hparams = dict(state["hparams"])
        self.x_mean = np.asarray(state["x_mean"], np.float32)
        self.x_std = np.asarray(state["x_std"], np.float32)
        self.y_mean, self.y_std = float(state["y_mean"]), float(state["y_std"])
        self.x_lo = np.asarray(state.get("x_lo", -np.inf), np.float32)
        self.x_hi = np.asarray(state.get("x_hi", np.inf), np.float32)
        self.prior_range = tuple(state.get("prior_range", (-np.inf, np.inf)))
        self.residual_range = tuple(state.get("residual_range", (-np.inf, np.inf)))
        self.val_loss = float(state.get("val_loss", float("nan")))
        self.prior = None
        if state.get("prior"):
            self.prior = AnalyticComputeModel()
            self.prior.load_state_dict(state["prior"])
            self.prior_mean, self.prior_std = state["prior_norm"]
        self.net = SetNet(int(state["num_inputs"]), self.hparams["hidden"], self.hparams["depth"],
                          1 if self.prior else 0)
        self.net.load_state_dict(state["weights"])
        self.net.eval()


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


class Correction:
    """A small MLP on clipped, normalised inputs giving log(measured / analytic)."""

    def __init__(self, hidden: int, depth: int):
        self.hidden, self.depth = hidden, depth
        self.net: nn.Module | None = None
        self.lo = self.hi = self.mean = self.std = None

    def fit(self, z: np.ndarray, log_ratio: np.ndarray, val_z: np.ndarray, val_log_ratio: np.ndarray,
            hp: dict, desc: str) -> None:
        self.lo, self.hi = z.min(0), z.max(0)
        self.mean, self.std = z.mean(0), z.std(0) + 1e-6
        self.net = mlp(z.shape[1], self.hidden, self.depth, 1)
        nn.init.zeros_(self.net[-1].weight)  # start as the analytic model
        nn.init.zeros_(self.net[-1].bias)
        x, y = torch.from_numpy(self._norm(z)), torch.from_numpy(log_ratio.astype(np.float32))
        vx, vy = torch.from_numpy(self._norm(val_z)), torch.from_numpy(val_log_ratio.astype(np.float32))

        def loss_of(net: nn.Module, rows: np.ndarray) -> torch.Tensor:
            rows_t = torch.from_numpy(rows)
            return nn.functional.smooth_l1_loss(net(x[rows_t]).squeeze(-1), y[rows_t], beta=0.05)

        def val_loss(net: nn.Module) -> float:
            return float((net(vx).squeeze(-1) - vy).abs().mean())

        self.net, _ = train_regressor(self.net, loss_of, len(z), val_loss, hp["epochs"], hp["batch_size"], hp["lr"],
                                      hp["weight_decay"], hp["patience"], hp["seed"], desc)

    def _norm(self, z: np.ndarray) -> np.ndarray:
        return ((np.clip(z, self.lo, self.hi) - self.mean) / self.std).astype(np.float32)

    @torch.no_grad()
    def __call__(self, z: np.ndarray) -> np.ndarray:
        shape = z.shape[:-1]
        with few_threads():
            out = self.net(torch.from_numpy(self._norm(z.reshape(-1, z.shape[-1])))).squeeze(-1).double().numpy()
        return out.reshape(shape)

    def state_dict(self) -> dict:
        return {"hidden": self.hidden, "depth": self.depth, "weights": self.net.state_dict(),
                "lo": self.lo.tolist(), "hi": self.hi.tolist(), "mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_state(cls, state: dict) -> "Correction":
        c = cls(int(state["hidden"]), int(state["depth"]))
        c.lo, c.hi, c.mean, c.std = (np.asarray(state[k], np.float64) for k in ("lo", "hi", "mean", "std"))
        c.net = mlp(len(c.lo), c.hidden, c.depth, 1)
        c.net.load_state_dict(state["weights"])
        c.net.eval()
        return c


class NeuralCommModel(CommCostModel):
    """Per-device communication ms: the analytic model times a learned correction, per direction."""

    name = "neural"

    def __init__(self, batch_size: int = 4096, hidden: int = 32, depth: int = 2, lr: float = 3e-3,
                 weight_decay: float = 1e-4, epochs: int = 300, train_batch_size: int = 256, patience: int = 30,
                 val_fraction: float = 0.15, seed: int = 0):
        self.batch_size = int(batch_size)
        self.hparams = dict(hidden=hidden, depth=depth, lr=lr, weight_decay=weight_decay, epochs=epochs,
                            batch_size=train_batch_size, patience=patience, val_fraction=val_fraction, seed=seed)
        self.analytic = AnalyticCommModel(batch_size)
        self.fwd = self.bwd = self.reduce = None

    def fit(self, samples: CommSamples | Sequence[CommSamples],
            val_samples: CommSamples | Sequence[CommSamples] | None = None) -> "NeuralCommModel":
        hp = self.hparams
        groups = as_comm_groups(samples)
        if val_samples is None:
            rng = np.random.default_rng(hp["seed"])
            splits = [np.split(rng.permutation(len(g)), [max(1, int(len(g) * hp["val_fraction"]))]) for g in groups]
            val_groups = [g.subset(v) for g, (v, _) in zip(groups, splits)]
            groups = [g.subset(t) for g, (_, t) in zip(groups, splits)]
        else:
            val_groups = as_comm_groups(val_samples)
        torch.manual_seed(hp["seed"])
        self.analytic.fit(groups)

        def data(gs: list[CommSamples], direction: str) -> tuple[np.ndarray, np.ndarray]:
            z, r = [], []
            for g in gs:
                if direction == "fwd":
                    zi = device_inputs(g.widths, g.skews_ms, self.batch_size)
                    base, true = self.analytic.predict_forward(g.widths, g.skews_ms), g.fwd_ms
                elif direction == "bwd":
                    zi = device_inputs(g.widths, None, self.batch_size)
                    base, true = self.analytic.predict_backward(g.widths), g.bwd_ms
                else:
                    g = g.reducing()
                    zi = reduce_inputs(g.reduce_width, g.num_devices, self.batch_size)
                    base, true = self.analytic.predict_reduce(g.reduce_width, g.num_devices), g.reduce_ms_per_sample
                z.append(zi.reshape(-1, zi.shape[-1]).astype(np.float64))
                r.append(np.log(np.maximum(true, 1e-6) / np.maximum(base, 1e-6)).ravel())
            return (np.concatenate(z) if z else np.zeros((0, 2))), (np.concatenate(r) if r else np.zeros(0))

        for direction in ("fwd", "bwd", "reduce"):
            train_z, train_r = data(groups, direction)
            val_z, val_r = data(val_groups, direction)
            if len(train_r) < 4 or len(val_r) < 1:  # nothing measured (no row-wise reduction): analytic only
                setattr(self, direction, None)
                continue
            correction = Correction(hp["hidden"], hp["depth"])
            correction.fit(train_z, train_r, val_z, val_r, hp, f"comm {direction} model")
            setattr(self, direction, correction)
        return self

    def _check(self) -> None:
        if self.analytic is None or not self.analytic.fitted:
            raise NeuroShardError("the neural comm model is not trained; call fit or load a checkpoint")

    def predict_forward(self, widths: np.ndarray, skews_ms: np.ndarray) -> np.ndarray:
        self._check()
        z = device_inputs(widths, skews_ms, self.batch_size)
        return self.analytic.predict_forward(widths, skews_ms) * np.exp(self.fwd(z) if self.fwd else 0.0)

    def predict_backward(self, widths: np.ndarray) -> np.ndarray:
        self._check()
        z = device_inputs(widths, None, self.batch_size)
        return self.analytic.predict_backward(widths) * np.exp(self.bwd(z) if self.bwd else 0.0)

    def predict_reduce(self, reduce_width: np.ndarray, num_devices: int) -> np.ndarray:
        self._check()
        z = reduce_inputs(reduce_width, num_devices, self.batch_size)
        return self.analytic.predict_reduce(reduce_width, num_devices) * np.exp(self.reduce(z) if self.reduce else 0.0)

    def state_dict(self) -> dict:
        return {"batch_size": self.batch_size, "hparams": dict(self.hparams), "analytic": self.analytic.state_dict(),
                **{d: getattr(self, d).state_dict() if getattr(self, d) else None for d in ("fwd", "bwd", "reduce")}}

    def load_state_dict(self, state: dict) -> None:
        self.batch_size = int(state["batch_size"])
        self.hparams = dict(state["hparams"])
        self.analytic = AnalyticCommModel(self.batch_size)
        self.analytic.load_state_dict(state["analytic"])
        for d in ("fwd", "bwd", "reduce"):
            setattr(self, d, Correction.from_state(state[d]) if state[d] else None)
