#!/usr/bin/env bash
# Session 60, run 4 (a fresh machine; carry .gpu/bin after ../shared/gpu/pack on cc64bbb):
# the floor probe again with the device pool keeping freed memory (run 1's build left the
# default release threshold of 0, so its whole-call rows paid a remapping each call),
# then the Rust bench's 1000 x 1 KiB rows once, on the same machine.
cd "$(dirname "$0")/../../.."
nvcc -O3 -Xcompiler -march=native -o /tmp/many_small_floor benches/probes/many_small_floor.cu -lcuda -lpthread \
  && timeout 100 /tmp/many_small_floor > "$OUT/floor.txt" 2>&1
echo "probe rc=$?"; cat "$OUT/floor.txt"
nvidia-smi --query-gpu=name,pci.bus_id --format=csv,noheader >> "$OUT/floor.txt"
timeout 60 .gpu/bin/bench-transfer --only "1000 x" > "$OUT/rust_1000.txt" 2>&1
grep -E "1 KiB f32  " "$OUT/rust_1000.txt"
