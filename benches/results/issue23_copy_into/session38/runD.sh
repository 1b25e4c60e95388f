#!/bin/bash
# Run D (session 38), at the final code (82ee53c: the registry of live registrations moved
# into pinned.rs, no change of logic since run C): the GPU checks (benches/gpu_verify.sh),
# then benches/copy_into.py with the new wheel, three processes.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rd; mkdir -p $OUT
trap 'tar czf $FINAL/runD.tar.gz -C /tmp rd' EXIT
bash benches/gpu_verify.sh $OUT
for i in 1 2 3; do
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 150 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_new$i.json > $OUT/copy_into_new$i.txt 2>&1
  echo "new$i rc=$?"; grep -E "^\| [0-9]" $OUT/copy_into_new$i.txt | cut -c1-250
done
