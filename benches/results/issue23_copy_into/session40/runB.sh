#!/bin/bash
# Run B (session 40), at a3d2d11: the GPU checks (benches/gpu_verify.sh), then
# benches/copy_into.py with three wheels in turn, three processes each: old
# (.gpu/ab/old: 09d253f, the gather kernel's descriptors read from the staging slot),
# mid (.gpu/ab/mid: 8e1b916, descriptors in the launch's parameters up to 127 pieces)
# and new (a3d2d11: the Python Pairs of CPU sources copied through H2dPairs, paired and
# checked once).
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rb; mkdir -p $OUT
trap 'tar czf $FINAL/runB.tar.gz -C /tmp rb' EXIT
bash benches/gpu_verify.sh $OUT
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
