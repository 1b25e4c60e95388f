#!/bin/bash
# Run C (session 42), at c1dde2b: the GPU checks (benches/gpu_verify.sh) after the
# slot-free in-place path; the probe benches/probes/inplace_floor.cu; then
# benches/copy_into.py with three wheels in turn, three processes each: old (.gpu/ab/old:
# 14995a0), mid (.gpu/ab/mid: run B's, the piece change alone) and new (c1dde2b).
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rc; mkdir -p $OUT
trap 'tar czf $FINAL/runC.tar.gz -C /tmp rc' EXIT
bash benches/gpu_verify.sh $OUT
/usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/inplace_floor benches/probes/inplace_floor.cu > $OUT/probe_build.txt 2>&1
timeout 60 /tmp/inplace_floor > $OUT/inplace_floor.txt 2>&1; echo "probe rc=$?"
for v in old mid; do
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_$v .gpu/ab/$v/*.whl || exit 1
done
for i in 1 2 3; do
  for v in old mid new; do
    P=/tmp/site; [ $v != new ] && P=/tmp/site_$v
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 100 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"
  done
done
