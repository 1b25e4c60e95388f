#!/usr/bin/env bash
# Session 68, run 4: tests/gpu_no_foreign_waits.rs as committed in bf814bc (the step at
# the pool's cap asserted a pageable fallback with the pool unchanged), three processes;
# the probe free_hold.cu with its part 3 (allocations while another stream is busy).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for i in 1 2 3; do
  PINLANE_REQUIRE_GPU=1 timeout 30 .gpu/extra/gpu_no_foreign_waits_fallback --nocapture > "$OUT/no_foreign_waits$i.txt" 2>&1
  echo "process $i: exit $?"; grep -E "cap|test result|panicked|exit" "$OUT/no_foreign_waits$i.txt" | cut -c1-300
done
nvcc -O3 -arch=sm_90 -o /tmp/free_hold benches/probes/free_hold.cu -lcuda && timeout 150 /tmp/free_hold > "$OUT/free_hold.txt" 2>&1
echo "probe rc=$?"; grep -E "part 3" "$OUT/free_hold.txt"
