#!/usr/bin/env bash
# Session 68, run 7: benches/into_then_h2d.rs (.gpu/extra/into_then_h2d, the final
# library), three processes: does a copy into existing tensors slow the same thread's
# (or the process's) later blocking 1 KiB H2D calls?
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for i in 1 2 3; do
  echo "=== process $i" | tee -a "$OUT/into_then_h2d.txt"
  timeout 120 .gpu/extra/into_then_h2d 2>&1 | tee -a "$OUT/into_then_h2d.txt"
done
