#!/bin/bash
# Run C (session 40), at a3d2d11 (no code change since run B): benches/copy_into.py with
# the old wheel (.gpu/ab/old: 09d253f) and the new one (a3d2d11: descriptors in the
# launch's parameters, and Pairs through H2dPairs) in turn, four processes each. Run B
# made the GPU checks at this code.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rc; mkdir -p $OUT
trap 'tar czf $FINAL/runC.tar.gz -C /tmp rc' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt
bash .gpu/with-python true || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_old .gpu/ab/old/*.whl || exit 1
for i in 1 2 3 4; do
  for v in old new; do
    P=/tmp/site; [ $v = old ] && P=/tmp/site_old
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 100 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"
  done
done
