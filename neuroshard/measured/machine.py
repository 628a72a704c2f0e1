"""Pre-train for this machine in one command (``neuroshard pretrain --here``).

On the machine it runs on, within a wall-clock budget (``minutes``, split over the stages by
fixed shares, ``SHARES``), this collects what the search and the iteration model ask about,
fits the cost models, holds out, reports, and keeps the result in this machine's folder
(``costmodels.samples.store.machine_dir``: ``$XDG_CACHE_HOME/neuroshard/machines/<fingerprint>/``),
which ``load_cost_models()`` and ``load_operator_models()`` then use by themselves whenever
the machine's fingerprint matches:

1. **compute**: shard sets timed as one fused kernel (``collect.collect_compute``) over tables
   of the training families ``TRAINING_FAMILIES`` only: per family, devices of plans searched
   on random 4-16-device tasks (``--sets plans``: the sets the search asks about) and random
   augmented sets of 1-80 shards (row slices and column strips, up to 3 GiB of weights: working
   sets beyond the last-level cache); and sets of the families' big hot tables beside their
   small ones;
2. **comm**: the runtime's exchange (all-to-all) at every device count this machine can run:
   2 to min(cores, 4) gloo processes (on ``cuda``, 2 to min(GPUs, 4));
3. **fit**: ``costmodels.pretrain`` on all of it (the neural, tree and analytic models held out
   and compared; an ensemble of neural models written), with held-out error per family and per
   model kind, and the shipped checkpoint's on the same held-out sets for reference;
4. **dense**: the operators of a training step besides the embeddings (``collect dense``);
5. **overheads**: the runtime's overheads in real runs (``collect overheads``) of the training
   families' configurations, priced with the model of stage 3.

The families ``HELD_OUT_FAMILIES`` (criteo-kaggle, criteo-terabyte, hot-few) are never
collected: they are the held-out families of the benchmark that judges the model. The one
exception is the dense stage's timing of a rank's data loading, which uses the operator
benchmark's own mix of tables (``costmodels.samples.dense.INPUT_FAMILIES``, criteo-kaggle and
hot-few tables among them): it prices the iteration model's input pipeline, not the embedding
costs that benchmark judges.

The collections stop when their share of the budget is spent (or at ``--compute-sets`` /
``--comm-sets``); the operator benchmark and the overhead runs are sized from their shares at
the pace of a quiet 2-core machine (``DENSE_FULL_SECONDS``, ``OVERHEAD_CONFIG_SECONDS``)
divided by this machine's pace now (``machine_pace``: a loaded machine measures less), the
overhead runs also within what the run has left.

Every stage resumes: collections continue their folders (``collect`` skips what is on disk),
the operator benchmark measures only the parts its file lacks, and a stage whose outputs are
up to date is skipped; the seconds each stage spent are kept in ``machine.json``, so a rerun
after an interruption spends only what is left of each share, and a rerun of a finished
command times nothing. Progress (``measured.progress``): one line updated in place on a
terminal, plain lines in a log, nothing when quiet: the stage, what is being timed, how many of
how many, and the time left of the budget.

Read in order: this module (the command: its options checked, the stages called),
``machine_profiles`` (what is measured and how much the budget buys), ``machine_stages`` (each
stage, resumable, in the machine's folder) and ``machine_report`` (the fit and ``report.txt``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..costmodels.samples import store
from ..errors import NeuroShardError
from ..validate import check_int, check_number
from .machine_profiles import (DEFAULT_MINUTES, HELD_OUT_FAMILIES, MIN_COMM_SAMPLES, MIN_COMPUTE_SETS, PROFILES,
                               TRAINING_FAMILIES, family_of)
from .machine_stages import HereResult, MachineRun, OverheadsFn
from .progress import PROGRESS_MODES

__all__ = ["DEFAULT_MINUTES", "HELD_OUT_FAMILIES", "PROFILES", "TRAINING_FAMILIES", "HereResult", "family_of",
           "pretrain_here"]


def pretrain_here(minutes: float = DEFAULT_MINUTES, *, size: str = "default", backend: str = "cpu",
                  compute_sets: int | None = None, comm_samples: int | None = None,
                  epochs: int | None = None, ensemble: int | None = None, test_tables: float = 0.25,
                  tune: int = 0, seed: int = 0, out: str | Path | None = None,
                  overheads: OverheadsFn | None = None, overhead_configs: Sequence[tuple] = (),
                  progress: str = "auto") -> HereResult:
    """Collect, fit, hold out and report for this machine into its folder (module docstring).

    ``size``: a profile of ``PROFILES``; ``compute_sets`` / ``comm_samples``: how many shard
    sets in all (split over the collections) and exchange samples per device count, instead
    of as many as the time shares allow; ``epochs``, ``ensemble``, ``test_tables``, ``tune``,
    ``seed``: ``costmodels.pretrain``'s (default: the profile's); ``out``: also write the
    checkpoint there. ``overheads``: ``runtime.overheads.calibrate_overheads`` (the runtime
    sits above this layer: the caller hands it in, with its ``overhead_configs``); without it
    the operator costs carry no overheads of real runs. ``progress``: a mode of
    ``measured.progress`` (``auto``: a line updated in place on a terminal, plain lines
    otherwise; ``quiet``: nothing)."""
    if size not in PROFILES:
        raise NeuroShardError(f"unknown size {size!r}; choose one of {', '.join(PROFILES)}")
    if backend not in ("cpu", "cuda"):
        raise NeuroShardError(f"unknown device {backend!r}; choose cpu or cuda")
    check_number(minutes, "minutes", 1.0 / 60, 24 * 60.0)
    profile = PROFILES[size]
    if compute_sets is None:
        compute_sets = profile.compute_sets
    else:
        check_int(compute_sets, "compute sets", MIN_COMPUTE_SETS, 10**6)
    if comm_samples is None:
        comm_samples = profile.comm_samples
    else:
        check_int(comm_samples, "comm samples", MIN_COMM_SAMPLES, 10**6)
    epochs = profile.epochs if epochs is None else epochs
    ensemble = profile.ensemble if ensemble is None else ensemble
    if progress not in PROGRESS_MODES:
        raise NeuroShardError(f"unknown progress mode {progress!r}; choose one of {', '.join(PROGRESS_MODES)}")
    if backend == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise NeuroShardError("--device cuda asked for, but torch sees no CUDA device")

    folder = store.machine_dir(backend)
    run = MachineRun(folder, store.machine_fingerprint(backend), PROFILES[size], minutes, backend, progress)
    try:
        run.say(f"{store.describe_fingerprint(run.result.fingerprint)}; folder {folder}; budget {minutes:g} minutes")
        compute_folders = run.compute(compute_sets)
        comm_folders = run.comm(comm_samples)
        models, signature = run.fit(compute_folders, comm_folders, epochs=epochs, ensemble=ensemble,
                                    test_tables=test_tables, tune=tune, seed=seed)
        if out is not None:
            models.save(out)
        operators = run.dense()
        run.overheads(models, operators, signature, overheads, overhead_configs)
        return run.finish()
    finally:
        run.bar.close()
