#!/bin/bash
# Run A (session 38), after the last engine change (page-locked sources of other owners,
# torch's pin_memory() among them, read in place by the scatter kernel where the driver
# maps them; large mapped sources join the launch; Pairs' pinned_in_place): the GPU checks
# (benches/gpu_verify.sh), then benches/copy_into.py with the old wheel (.gpu/ab/old:
# 247d2b2) and the new one in turn, three processes each.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/ra; mkdir -p $OUT
trap 'tar czf $FINAL/runA.tar.gz -C /tmp ra' EXIT
bash benches/gpu_verify.sh $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_old .gpu/ab/old/*.whl || exit 1
for i in 1 2 3; do
  for v in old new; do
    P=/tmp/site; [ $v = old ] && P=/tmp/site_old
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 150 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"; grep -E "^\| [0-9]" $OUT/copy_into_${v}$i.txt | cut -c1-230
  done
done
