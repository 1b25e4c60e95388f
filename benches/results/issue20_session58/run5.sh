#!/usr/bin/env bash
# Session 58, run 5 (one H200, the machine of runs 1 to 4; carry .gpu/bin): where the
# Rust 1000 x 1 KiB H2D from pageable memory goes (86 to 87 us in run 4, above the 80 us
# target), traced per phase in three processes.
cd "$(dirname "$0")/../../.."
for r in 1 2 3; do
  echo "== process $r"
  timeout 90 .gpu/bin/bench-transfer --trace --only "1000 x 1 KiB" 2>&1
done > "$OUT/trace_1000.txt"
grep -E "^==|trace 1000 x 1 KiB f32 h2d (\(|:)|H2D pageable" "$OUT/trace_1000.txt" | cut -c1-400
