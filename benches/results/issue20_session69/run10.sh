#!/usr/bin/env bash
# Session 69, run 10: the final code (the review's mends of the kept device blocks): the
# GPU checks, then one round of run 7's comparison (PINLANE_SMALL_DEVICE_BLOCKS=0 and 8).
# Carry: ../shared/gpu/pack --peers, bash tests/pack-shipped, bash benches/gpu_fold.sh.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify"
for v in 0 8; do
  echo "=== PINLANE_SMALL_DEVICE_BLOCKS=$v" >> "$OUT/ab.txt"
  PINLANE_SMALL_DEVICE_BLOCKS=$v timeout 100 .gpu/bin/bench-transfer --only "1 x 1 KiB" >> "$OUT/ab.txt" 2>&1
  PINLANE_SMALL_DEVICE_BLOCKS=$v timeout 60 .gpu/bin/bench-into_then_h2d >> "$OUT/ab.txt" 2>&1
done
grep -E "===|1 x 1 KiB|fresh|kernel" "$OUT/ab.txt"
