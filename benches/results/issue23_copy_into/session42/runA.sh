#!/bin/bash
# Run A (session 42), at 14995a0 plus the probe: the GPU checks (benches/gpu_verify.sh),
# which 560e270 and 14995a0 never had; then benches/probes/inplace_floor.cu; then
# benches/copy_into.py with the current wheel, two processes.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/ra; mkdir -p $OUT
trap 'tar czf $FINAL/runA.tar.gz -C /tmp ra' EXIT
bash benches/gpu_verify.sh $OUT
/usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/inplace_floor benches/probes/inplace_floor.cu > $OUT/probe_build.txt 2>&1
timeout 60 /tmp/inplace_floor > $OUT/inplace_floor.txt 2>&1; echo "probe rc=$?"
for i in 1 2; do
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 100 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_new$i.json > $OUT/copy_into_new$i.txt 2>&1
  echo "new$i rc=$?"
done
