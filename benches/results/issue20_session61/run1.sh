#!/usr/bin/env bash
# Session 61, run 1 (carry .gpu after ../shared/gpu/pack --peers, tests/pack-shipped and
# benches/gpu_fold.sh on b8d5b2a, with .gpu/bin/bench-transfer-cf4282e the same bench built
# on cf4282e, the commit before: one carry for every run of the session):
#   1. the Rust bench's 1 KiB rows (one 1 KiB tensor, 1000 x 1 KiB), the old build and the
#      new in turn, four processes each; then one traced process of each;
#   2. the floor probe under 1000 x 1 KiB pageable H2D with the device pool keeping its
#      memory (session 60's run4.sh, not run then).
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
for r in 1 2 3 4; do
  for b in bench-transfer-cf4282e bench-transfer; do
    echo "== process $r, $b"
    timeout 60 .gpu/bin/$b --only "1 KiB" 2>&1
  done
done > "$OUT/rust_small_ab.txt"
grep -E "^==|1 KiB f32  " "$OUT/rust_small_ab.txt"
for b in bench-transfer-cf4282e bench-transfer; do
  echo "== traced, $b"
  timeout 60 .gpu/bin/$b --only "1000 x" --trace 2>&1
done > "$OUT/rust_trace_ab.txt"
grep -E "^==|trace 1000 x 1 KiB f32 h2d \(|1 KiB f32  " "$OUT/rust_trace_ab.txt" | cut -c1-400
nvcc -O3 -Xcompiler -march=native -o /tmp/many_small_floor benches/probes/many_small_floor.cu -lcuda -lpthread \
  && timeout 100 /tmp/many_small_floor > "$OUT/floor.txt" 2>&1
echo "probe rc=$?"; cat "$OUT/floor.txt"
