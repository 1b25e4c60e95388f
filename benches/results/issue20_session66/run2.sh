#!/usr/bin/env bash
# Session 66, run 2. Carry .gpu after `../shared/gpu/pack --peers`, `bash tests/pack-shipped`,
# `bash benches/gpu_fold.sh`. The GPU checks on the retained-groups change
# (benches/gpu_verify.sh all: every test binary, the Python suite, the shipped build,
# compute-sanitizer), then benches/probes/unregister_wait.cu (whether cuMemHostUnregister
# waits for other streams' work).
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify" 2>&1 | tee "$OUT/verify-summary.txt"
(cd benches/probes && nvcc -O3 -arch=sm_90 -o /tmp/unregister_wait unregister_wait.cu -lcuda) \
  && timeout 60 /tmp/unregister_wait > "$OUT/unregister_wait.txt" 2>&1
echo "unregister_wait rc=$?"; cat "$OUT/unregister_wait.txt"
