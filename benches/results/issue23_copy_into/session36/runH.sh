#!/bin/bash
# Run H (session 36), a probe, not a build that was kept: c7a650e plus runH.patch
# (temporary trace marks inside completion::reap, complete and Detached::release; the
# Python wheel only). Issue 23's serving-step bench x2, to split the "reaped" span (the
# release of the last step, 2.1 to 3.0 us of a Pairs step) into its parts.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rh; mkdir -p $OUT
trap 'tar czf $FINAL/runH.tar.gz -C /tmp rh' EXIT
bash .gpu/with-python true
for i in 1 2; do
  PYTHONUNBUFFERED=1 timeout 150 bash .gpu/with-python python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_H$i.json > $OUT/copy_into_H$i.txt 2>&1
  echo "H$i rc=$?"; grep -E "call .* us; device span" $OUT/copy_into_H$i.txt | grep "19 KiB" | cut -c1-60,150-700
done
