#!/bin/bash
# Run F (session 36), a probe (the one run E meant to be), with the bench's new
# --configure: issue 23's serving-step bench under three configurations in turn, three
# processes each: the defaults; parallel_min=1048576 (the 280 KiB and 492 KiB steps'
# pageable fills on the calling thread, not the copy threads; default 256 KiB); and
# spin_us=1000 (the copy threads spin 1 ms before sleeping, default 50 us: awake between
# steps). Where the copy threads' wake-up goes in run B's pageable steps (28 to 32 us
# from the slot's lease to the submission, 25 to 29 from the fill's start).
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rf; mkdir -p $OUT
trap 'tar czf $FINAL/runF.tar.gz -C /tmp rf' EXIT
bash .gpu/with-python true
one() { # tag configure...
  tag=$1; shift
  PYTHONUNBUFFERED=1 timeout 150 bash .gpu/with-python python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_$tag.json "$@" > $OUT/copy_into_$tag.txt 2>&1
  echo "$tag rc=$?"; grep -E "^pinlane.configure" $OUT/copy_into_$tag.txt; grep -E "^\| [0-9]" $OUT/copy_into_$tag.txt | cut -c1-200; grep -E "Pairs.copy's call" $OUT/copy_into_$tag.txt | cut -c1-60,150-330
}
for i in 1 2 3; do
  one default$i
  one pmin$i --configure parallel_min=1048576
  one spin$i --configure spin_us=1000
done
