#!/usr/bin/env bash
# Session 72, run 4: on the final code (7dba871: a foreign owner's wait on the free
# thread, settle waiting for it; Checkpoint::stream copying unaligned tensors per group),
# the GPU test binaries, then the Python suite with torch (the device time left, under
# 300 s, was too little for the shipped binaries and compute-sanitizer as well).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L3 cache"
bash benches/gpu_verify.sh tests "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|FAILED|failed" "$OUT/verify.log" | tail -12
