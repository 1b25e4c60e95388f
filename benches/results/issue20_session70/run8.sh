#!/usr/bin/env bash
# Session 70, run 8: benches/probes/legacy_order.cu with its cuStreamGetId row, three
# processes, the first round of each (head -9).
cd "$(dirname "$0")/../../../benches/probes" || exit 1
nvcc -O3 -arch=sm_90 -o /tmp/legacy_order legacy_order.cu -lcuda
for p in 1 2 3; do echo "== process $p"; /tmp/legacy_order | head -9; done > "$OUT/stream_id.txt" 2>&1
cat "$OUT/stream_id.txt"
