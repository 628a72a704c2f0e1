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
#    (the held-out 30% are what experiments/evaluate.py builds its tasks from)
mkdir -p out
neuroshard tables generate --preset dlrm-2021 --seed 0 -o out/dlrm2021.json --calibration-tables 0
neuroshard tables split out/dlrm2021.json --train out/dlrm2021-train.json --test out/dlrm2021-test.json
neuroshard collect compute --tables out/dlrm2021-train.json --samples 2500 --out $D/compute-dlrm2021 \
  --max-tables-per-device 8 --memory 1GiB --batch-size 4096 --dims 4..128 --seed 100 --max-minutes 55
