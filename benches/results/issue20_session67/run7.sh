#!/usr/bin/env bash
# Session 67, run 7: tests/gpu_no_foreign_waits.rs as committed at the end (the
# registration outlives the other stream's work), built at the final code
# (.gpu/extra/gpu_no_foreign_waits_fixed), three processes.
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
for i in 1 2 3; do
  PINLANE_REQUIRE_GPU=1 timeout 30 .gpu/extra/gpu_no_foreign_waits_fixed --nocapture > "$OUT/no_foreign_waits$i.txt" 2>&1
  echo "process $i: exit $?"; grep -E "[0-9]{3,}\.[0-9]+ ms$|test result|in all" "$OUT/no_foreign_waits$i.txt" | cut -c1-200
done
