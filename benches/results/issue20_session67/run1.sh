#!/usr/bin/env bash
# Session 67, run 1. Carry .gpu after `../shared/gpu/pack --peers`, `bash tests/pack-shipped`,
# `bash benches/gpu_fold.sh`. The GPU checks on session 66's final code (ffb6ff0, never
# run on a GPU), then the registration probe (benches/probes/unregister_wait.cu), whose
# device-mapped rows never ran.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh "${PART:-all}" "$OUT/verify" 2>&1 | tee "$OUT/verify-summary.txt"
grep -B2 -A14 "no_foreign" "$OUT/verify/tests.log" | grep -E "ms|test result|FAIL" | head -14
nvcc -O3 -arch=sm_90 -o /tmp/uw benches/probes/unregister_wait.cu -lcuda > "$OUT/probe.txt" 2>&1 && timeout 120 /tmp/uw >> "$OUT/probe.txt" 2>&1
echo "probe exit $?"; cat "$OUT/probe.txt"
