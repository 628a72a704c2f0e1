"""A DLRM training runtime on torch.distributed that executes a plan and measures it.

- ``trainer.run(RunConfig(plan, tables, devices, ...))``: train with the plan's shards,
  one process per device (spawned here, or started by torchrun);
- ``evaluate.evaluate(plan, tables, ...)``: per-device measured embedding compute,
  forward and backward communication (what the cost models predict);
- ``evaluate.measure_alternating({name: plan}, tables, runs=...)``: compare plans in
  runs where they take turns of a few steps (A/B), so a shared machine's slow spells cancel;
- ``judge.RuntimeJudge``: refine's final choice made by training its plans and the
  baselines' together here (``search --refine N --judge runtime``);
- ``model.train_reference``: the same model unsharded in one process;
- ``cached``: shards whose rows live in host memory or on SSD train on a bounded device
  cache (LRU), their miss rates and miss-path time measured (``RunResult.cache``);
- ``memory``: the embedding storage each rank holds, measured, beside the plan's estimate
  for it (``RunResult.memory``, printed by ``neuroshard train``).

The modules import torch; this package's ``__init__`` does not, so the CLI stays fast.
"""
