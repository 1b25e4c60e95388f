#!/bin/bash
# Run L (session 34): the 1 KiB rows of the new build (5ad2eb3) under other copy-thread
# settings (PINLANE_COPY_THREADS, PINLANE_SPIN_US), traced, twice each.
cd "$(dirname "$0")/.."
FINAL=$OUT; OUT=/tmp/rl; mkdir -p $OUT
trap 'tar czf $FINAL/runL.tar.gz -C /tmp rl' EXIT
for i in 1 2; do
for set in "12 50" "6 50" "4 50" "12 200" "6 200"; do
  th=${set% *}; sp=${set#* }
  PINLANE_COPY_THREADS=$th PINLANE_SPIN_US=$sp timeout 100 .gpu/bin/bench-transfer --only "1000 x 1 KiB" --trace --json $OUT/tiny_t${th}_s${sp}_$i.json > $OUT/tiny_t${th}_s${sp}_$i.txt 2>&1
  echo "threads $th spin $sp run $i rc=$?"; grep -E "^1000 x 1 KiB|^trace 1000.*h2d .median" $OUT/tiny_t${th}_s${sp}_$i.txt | cut -c1-250
done
done
