#!/usr/bin/env bash
# Session 70, run 2: benches/probes/legacy_order.cu (CUDA C, no pinlane), three processes:
# what ordering one 1 KiB D2H after the legacy stream costs, by event or by a blocking stream.
cd "$(dirname "$0")/../../../benches/probes" || exit 1
nvcc -O3 -arch=sm_90 -o /tmp/legacy_order legacy_order.cu -lcuda
for p in 1 2 3; do echo "== process $p"; /tmp/legacy_order; done > "$OUT/legacy_order.txt" 2>&1
cat "$OUT/legacy_order.txt"
