#!/usr/bin/env bash
# Session 67, run 4: tests/gpu_no_foreign_waits.rs after run 3's failure (the worker
# dropped its 128 MiB `to_pinned` source itself, untimed but inside the total: the free
# waits for the device), built at the final code (.gpu/extra/gpu_no_foreign_waits_fixed,
# `cargo test --all-features --release --no-run --test gpu_no_foreign_waits`, stripped).
# Two processes. Run 5: the same, with the untimed parts timed too (the copy queued ahead,
# the check, the worker thread's exit).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
for i in 1 2; do
  PINLANE_REQUIRE_GPU=1 timeout 60 .gpu/extra/gpu_no_foreign_waits_fixed --nocapture > "$OUT/no_foreign_waits$i.txt" 2>&1
  echo "process $i: exit $?"; grep -E " ms$|test result" "$OUT/no_foreign_waits$i.txt"
done
