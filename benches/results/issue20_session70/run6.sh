#!/usr/bin/env bash
# Session 70, run 6: the suites on the final CUDA path (19e644d: the review mends of the kept blocks for borrowed streams), then
# benches/probes/torch_stream_small.py with the blocks off (small_device_blocks=0) and on
# (the default), in turn, three rounds each. Carry: .gpu packed at the change.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
bash .gpu/with-python bash -c '
for r in 1 2 3; do
  for v in 0 8; do
    timeout 120 python3 -c "
import runpy, sys, pinlane
pinlane.configure(small_device_blocks=$v)
sys.argv = [\"x\", \"round $r, small_device_blocks=$v\"]
runpy.run_path(\"benches/probes/torch_stream_small.py\", run_name=\"__main__\")
"
  done
done' > "$OUT/torch_stream.txt" 2>&1
cat "$OUT/torch_stream.txt"

for p in 1 2 3; do
  .gpu/bin/bench-transfer --only "1 x 1 KiB" 2>&1 | grep -E "D2H pinned out|H2D pageable"
done > "$OUT/rust_small.txt" 2>&1
cat "$OUT/rust_small.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
