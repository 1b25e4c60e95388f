#!/usr/bin/env bash
# Session 69, run 7: the kept small device blocks (Config::small_device_blocks). The GPU
# checks of the change, then the same binaries with PINLANE_SMALL_DEVICE_BLOCKS=0 (each
# output freed at once, as before) and with the default (8), in turn, three rounds:
# bench-transfer's one-tensor rows (kernel-free processes), and into_then_h2d (blocking
# 1 KiB H2D before and after the process's first kernel launch).
# Carry: ../shared/gpu/pack --peers, bash tests/pack-shipped, bash benches/gpu_fold.sh.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify"
for r in 1 2 3; do
  for v in 0 8; do
    echo "=== round $r, PINLANE_SMALL_DEVICE_BLOCKS=$v" >> "$OUT/ab.txt"
    PINLANE_SMALL_DEVICE_BLOCKS=$v timeout 100 .gpu/bin/bench-transfer --only "1 x 1 KiB" >> "$OUT/ab.txt" 2>&1
    PINLANE_SMALL_DEVICE_BLOCKS=$v timeout 60 .gpu/bin/bench-into_then_h2d >> "$OUT/ab.txt" 2>&1
  done
done
grep -E "===|1 x 1 KiB|fresh|kernel" "$OUT/ab.txt"
