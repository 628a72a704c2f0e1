#!/bin/bash
# Background cost-data collection (resumable: rerun the same commands to continue).
cd /work/main
D=/work/main/neuroshard/checkpoints/data/cpu
nohup /work/venv/bin/neuroshard collect compute --tables out/measure_tables.json --samples 3000 \
  --out $D/compute --max-tables-per-device 8 --memory 1GiB --batch-size 4096 --dims 4..128 --seed 0 \
  --max-minutes 44 >> out/collect_compute.log 2>&1 &
echo "compute pid $!"
nohup bash -c "for d in 2 3 4; do /work/venv/bin/neuroshard collect comm --devices \$d --samples 300 \
  --out $D/comm/comm\$d --batch-size 4096 --seed 0 --max-minutes 7; done" >> out/collect_comm.log 2>&1 &
echo "comm loop pid $!"
