#!/usr/bin/env bash
# Session 71, run 3: run 2 found pipeline_slots=4 ahead of the default 8 on this host at
# both large rows; this sweeps the pipeline depth alone (2, 3, 4, 6, 8 slots of 8 MiB),
# four rounds in turn, one process each: the Rust bench's 8 x 32 MiB and 1 GiB rows, H2D
# from pageable memory and D2H into pageable outputs (the two staged ways).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L3 cache"
for round in 1 2 3 4; do
  for p in 8 4 2 6 3; do
    for b in "8 x 32 MiB" "1 GiB"; do
      echo "=== round $round p$p ($b)"
      PINLANE_PIPELINE_SLOTS=$p timeout 90 .gpu/bin/bench-transfer --only "$b" 2>&1 | grep -E "limit \(256|H2D pageable|D2H pageable"
    done
  done
done > "$OUT/depth.txt" 2>&1
tail -4 "$OUT/depth.txt"
