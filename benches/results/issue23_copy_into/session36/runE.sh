#!/bin/bash
# Run E (session 36), at ef83752: issue 23's serving-step bench under three settings in
# turn, two processes each: the defaults; PINLANE_PARALLEL_MIN=600000 (the 280 KiB and
# 492 KiB steps' pageable fills on the calling thread instead of the woken copy threads;
# the default is 256 KiB); and the same with PINLANE_NT_COPY=0 (ordinary stores). A probe
# of whether the pool's wake-up is what makes those fills take 20 to 25 us.
# Note, after the run: the Python package reads no PINLANE_* variable (its configuration
# comes from pinlane.configure only: README, "Configuration"), so all six processes ran
# the default configuration; the run is six more default processes, not a probe.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/re; mkdir -p $OUT
trap 'tar czf $FINAL/runE.tar.gz -C /tmp re' EXIT
bash .gpu/with-python true
one() { # tag env...
  tag=$1; shift
  env "$@" PYTHONUNBUFFERED=1 timeout 150 bash .gpu/with-python python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_$tag.json > $OUT/copy_into_$tag.txt 2>&1
  echo "$tag rc=$?"; grep -E "^\| [0-9]" $OUT/copy_into_$tag.txt | cut -c1-200; grep -E "Pairs.copy's call" $OUT/copy_into_$tag.txt | grep -E "280|492" | cut -c1-60,150-330
}
for i in 1 2; do
  one default$i X=1
  one pmin$i PINLANE_PARALLEL_MIN=600000
  one pmin_nt0_$i PINLANE_PARALLEL_MIN=600000 PINLANE_NT_COPY=0
done
