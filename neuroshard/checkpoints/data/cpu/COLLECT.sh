#!/bin/bash
# How the CPU cost data in this folder was measured (2-core Xeon VM, fbgemm-gpu-cpu 1.8.0 TBE,
# one thread per device, batch 4096). Every command is resumable: rerun it to continue.
set -e
cd "$(git rev-parse --show-toplevel)"
D=neuroshard/checkpoints/data/cpu

# 1. 3000 shard sets over 60 hand-made varied tables (zipf and histogram access; copy in compute/tables.json)
neuroshard collect compute --tables $D/compute/tables.json --samples 3000 --out $D/compute \
  --max-tables-per-device 8 --memory 1GiB --batch-size 4096 --dims 4..128 --seed 0 --max-minutes 44

# 2. all-to-all on 2, 3 and 4 gloo processes (the runtime's exchange: all-to-all + column layout)
for d in 2 3 4; do
  neuroshard collect comm --devices $d --samples 300 --out $D/comm/comm$d --batch-size 4096 --seed 0 --max-minutes 7
done

# 3. 2500 shard sets over the *training* tables of the calibrated dlrm-2021 benchmark
#    (the held-out 30% are what experiments/plan_benchmark.py builds its tasks from)
mkdir -p out
neuroshard tables generate --preset dlrm-2021 --seed 0 -o out/dlrm2021.json --calibration-tables 0
neuroshard tables split out/dlrm2021.json --train out/dlrm2021-train.json --test out/dlrm2021-test.json
neuroshard collect compute --tables out/dlrm2021-train.json --samples 2500 --out $D/compute-dlrm2021 \
  --max-tables-per-device 8 --memory 1GiB --batch-size 4096 --dims 4..128 --seed 100 --max-minutes 55

# 4. (2026-11-23) Wide sets covering real plans: 1-40 shards per set, up to 3 GiB per device (rows capped
#    at 1,000,000 per shard), row slices 30%, pooling 0.03-118, zipf 0.5-1.4 and the dlrm-2022 reuse
#    histograms; tables of three families (broad, dlrm-2022, hot-few) at seeds no benchmark task uses.
#    dlrm-2021, criteo-kaggle and criteo-terabyte stay held out of this data entirely.
python - <<'PY'
from neuroshard.datasets.families import generate
from neuroshard.tables import TableSet
tables = []
for family, count, seed in (("broad", 160, 1001), ("dlrm-2022", 120, 1002), ("hot-few", 60, 1003)):
    for t in generate(family, count, seed):
        t.name = f"{family}-{t.name}"
        tables.append(t)
TableSet("pretrain-wide", tables, 4096, {"families": ["broad s1001", "dlrm-2022 s1002", "hot-few s1003"]}
         ).write("neuroshard/checkpoints/data/cpu/compute-wide/tables.json")
PY
neuroshard collect compute $D/compute-wide/tables.json --samples 3000 -o $D/compute-wide \
  --max-tables-per-device 40 --memory 3GiB --dims 4..128 --row-split-prob 0.3 --seed 0 \
  --repeats 3 --max-repeats 5 --max-minutes 95

# 5. (2026-11-23) The sets the search asks about: devices of plans searched (NeuroShard and the greedy
#    baselines, shipped models) on random 4/8/16-device tasks of the same wide tables (5-40 tables per
#    device, memory 1.2-1.5x the tables); weights allocated per set at most 3 GiB (rows capped).
neuroshard collect compute $D/compute-wide/tables.json --sets plans --samples 2000 -o $D/compute-plans \
  --memory 64GiB --seed 0 --repeats 3 --max-repeats 5 --max-minutes 50

# 6. (2026-11-23) One width per set, mostly one-hot: the DLRM reference models give every table the
#    same width and one lookup per sample, and the pre-trained model predicted such sets 40-50% too high
#    (criteo-kaggle, held out). 120 new tables (rows 3..1e7 log-uniform, pooling 0.5-4 around 1, zipf
#    0.9-1.3; no benchmark family's rows), sets of 1-40 shards cut to one width each: 16, 32, 64, 128.
python - <<'PY'
import numpy as np
from neuroshard.tables import Table, TableSet
rng = np.random.default_rng(1006)
rows = np.round(10 ** rng.uniform(0.5, 7, 120)).astype(int)
pooling = np.clip(rng.lognormal(0.0, 0.5, 120), 0.5, 4.0)
alphas = rng.uniform(0.9, 1.3, 120)
TableSet("pretrain-one-width", [Table(f"w{i:03d}", int(max(rows[i], 3)), 128, float(round(pooling[i], 3)),
                                      {"zipf_alpha": float(round(alphas[i], 3)), "row_order": "scattered"}) for i in range(120)],
         4096, {"family": "one-width s1006"}).write("neuroshard/checkpoints/data/cpu/compute-one-width/tables.json")
PY
for w in 16 32 64 128; do
  neuroshard collect compute $D/compute-one-width/tables.json --samples 250 -o $D/compute-one-width/w$w \
    --max-tables-per-device 40 --memory 2GiB --dims $w --row-split-prob 0.1 --seed $w \
    --repeats 3 --max-repeats 5 --max-minutes 6
done
