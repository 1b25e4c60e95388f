#!/usr/bin/env bash
# Session 68, run 3: does pinlane's free of an evicted output block hold other copies?
# tests/gpu_no_foreign_waits.rs asserting the eviction happens (pool stats printed),
# three processes; the probe free_hold.cu with its part 2 (threads as in that test).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for i in 1 2 3; do
  PINLANE_REQUIRE_GPU=1 timeout 30 .gpu/extra/gpu_no_foreign_waits_stats --nocapture > "$OUT/no_foreign_waits$i.txt" 2>&1
  echo "process $i: exit $?"; grep -E " ms$|test result|pinned outputs|panicked" "$OUT/no_foreign_waits$i.txt" | cut -c1-400
done
nvcc -O3 -arch=sm_90 -o /tmp/free_hold benches/probes/free_hold.cu -lcuda && timeout 150 /tmp/free_hold > "$OUT/free_hold.txt" 2>&1
echo "probe rc=$?"; grep -E "part 2|idle" "$OUT/free_hold.txt"; grep -c "" "$OUT/free_hold.txt"
