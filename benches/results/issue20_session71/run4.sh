#!/usr/bin/env bash
# Session 71, run 4: run 3's pipeline-depth sweep on a fresh machine (the previous one
# given back first, so possibly another host): 8, 4 and 6 slots of 8 MiB, four rounds in
# turn, one process each; the Rust bench's 8 x 32 MiB and 1 GiB rows, H2D from pageable
# memory and D2H into pageable outputs.
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L3 cache"
for round in 1 2 3 4; do
  for p in 8 4 6; do
    for b in "8 x 32 MiB" "1 GiB"; do
      echo "=== round $round p$p ($b)"
      PINLANE_PIPELINE_SLOTS=$p timeout 90 .gpu/bin/bench-transfer --only "$b" 2>&1 | grep -E "limit \(256|H2D pageable|D2H pageable"
    done
  done
done > "$OUT/depth.txt" 2>&1
tail -3 "$OUT/depth.txt"
