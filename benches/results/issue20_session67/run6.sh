#!/usr/bin/env bash
# Session 67, run 6: benches/probes/batch_copy_wait.cu (does cuMemcpyBatchAsync wait for
# another stream's host function?), then tests/gpu_no_foreign_waits.rs as in run 5, four
# processes.
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
nvcc -O3 -arch=sm_90 -o /tmp/bcw benches/probes/batch_copy_wait.cu -lcuda > "$OUT/probe.txt" 2>&1 && timeout 60 /tmp/bcw >> "$OUT/probe.txt" 2>&1
echo "probe exit $?"; cat "$OUT/probe.txt"
for i in 1 2 3 4; do
  PINLANE_REQUIRE_GPU=1 timeout 60 .gpu/extra/gpu_no_foreign_waits_fixed --nocapture > "$OUT/no_foreign_waits$i.txt" 2>&1
  echo "process $i: exit $?"; grep -E "   [0-9]{3,}\.[0-9]+ ms$|test result" "$OUT/no_foreign_waits$i.txt"
done
