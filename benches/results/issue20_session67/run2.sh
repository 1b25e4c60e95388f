#!/usr/bin/env bash
# Session 67, run 2: where the registration step of tests/gpu_no_foreign_waits.rs waits.
# Carry .gpu with .gpu/extra/diag_no_foreign_waits: that test with the step timed in its
# parts and a pageable copy into existing tensors before it (built at run 1's code plus
# the test's change, `cargo test --all-features --release --no-run --test
# gpu_no_foreign_waits`, stripped), with two DIAG steps first: an async H2D waited, then a
# blocking one on the same thread (does its poke host function block the stream?). Then the corrected probe (registrations timed while
# the other stream runs; another stream's host function timed).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
for i in 1 2; do
  PINLANE_REQUIRE_GPU=1 timeout 60 .gpu/extra/diag_no_foreign_waits --nocapture > "$OUT/diag$i.txt" 2>&1
  echo "diag $i: exit $?"; grep -E " ms$|test result" "$OUT/diag$i.txt"
done
nvcc -O3 -arch=sm_90 -o /tmp/uw benches/probes/unregister_wait.cu -lcuda > "$OUT/probe.txt" 2>&1 && timeout 120 /tmp/uw >> "$OUT/probe.txt" 2>&1
echo "probe exit $?"; cat "$OUT/probe.txt"
