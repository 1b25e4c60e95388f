#!/bin/bash
# Run C (session 39), after 9359d02 (copies into existing tensors release the thread's
# last step after queueing their own copies, before leasing only when no slot is free):
# the GPU checks (benches/gpu_verify.sh), then benches/copy_into.py with the old wheel
# (.gpu/ab/old: 67c00bd, the engine of c90fcd6) and the new one in turn, four processes each.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rc; mkdir -p $OUT
trap 'tar czf $FINAL/runC.tar.gz -C /tmp rc' EXIT
bash benches/gpu_verify.sh $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_old .gpu/ab/old/*.whl || exit 1
for i in 1 2 3 4; do
  for v in old new; do
    P=/tmp/site; [ $v = old ] && P=/tmp/site_old
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 100 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"; grep -E "^\| [0-9]" $OUT/copy_into_${v}$i.txt | cut -c1-120
  done
done
