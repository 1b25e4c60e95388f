#!/bin/bash
# Run B (session 42): the GPU checks (benches/gpu_verify.sh) after the change of the
# in-place scatter's piece size (sources cut into 8 or 16 KiB pieces when that lets the
# descriptors go in the launch); then benches/probes/inplace_floor.cu again; then
# benches/copy_into.py with the old wheel (.gpu/ab/old: 14995a0) and the new in turn,
# three processes each.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rb; mkdir -p $OUT
trap 'tar czf $FINAL/runB.tar.gz -C /tmp rb' EXIT
bash benches/gpu_verify.sh $OUT
/usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/inplace_floor benches/probes/inplace_floor.cu > $OUT/probe_build.txt 2>&1
timeout 60 /tmp/inplace_floor > $OUT/inplace_floor.txt 2>&1; echo "probe rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_old .gpu/ab/old/*.whl || exit 1
for i in 1 2 3; do
  for v in old new; do
    P=/tmp/site; [ $v != new ] && P=/tmp/site_$v
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 100 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"
  done
done
