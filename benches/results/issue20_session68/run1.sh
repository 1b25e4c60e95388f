#!/usr/bin/env bash
# Session 68, run 1: the final code of session 67 (c07094a), never run on a GPU:
# benches/gpu_verify.sh all, then the probe batch_copy_wait.cu (its cuMemFreeHost rows).
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify"
nvcc -O3 -arch=sm_90 -o /tmp/bcw benches/probes/batch_copy_wait.cu -lcuda && timeout 120 /tmp/bcw > "$OUT/batch_copy_wait.txt" 2>&1
echo "probe rc=$?"; tail -30 "$OUT/batch_copy_wait.txt"
