#!/usr/bin/env bash
# Session 58, run 4 (one H200, the machine of runs 1 to 3; carry .gpu/bin after
# ../shared/gpu/pack): the Rust bench's small rows (one 1 KiB tensor, 1000 x 1 KiB) in
# three more processes, for the Rust targets (run 3 had one).
cd "$(dirname "$0")/../../.."
for r in 1 2 3; do
  echo "== process $r"
  timeout 90 .gpu/bin/bench-transfer --only "1 KiB" 2>&1
done > "$OUT/rust_small.txt"
grep -E "^==|1 KiB f32  " "$OUT/rust_small.txt"
