#!/usr/bin/env bash
# Session 61, run 4 (a fresh machine; carry .gpu/bin with four builds of the Rust bench:
# cf4282e; b8d5b2a, whose H2D hands a batch's leading pageable tensors to the copy threads
# 128 at a time during the walk ("lead128"); the same with 512 at a time ("lead512"); and
# cf4282e with the copy threads' smallest piece 128 KiB instead of 16 ("piece128k": a
# 1 MiB window in 8 pieces instead of 48)). Three rounds of: each build once, then cf4282e
# with 3 and 6 copy threads (PINLANE_COPY_THREADS; 12 by default on this host). Are the
# copy threads' fills slowing the calling thread's own memory-bound work (the walk, the
# rebuild)? Then one traced process of lead512 and piece128k, and the images' rows.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
for r in 1 2 3; do
  for b in cf4282e lead128 lead512 piece128k; do
    echo "== process $r, $b"
    timeout 60 .gpu/bin/bench-transfer-$b --only "1000 x" 2>&1
  done
  for n in 3 6; do
    echo "== process $r, cf4282e, PINLANE_COPY_THREADS=$n"
    PINLANE_COPY_THREADS=$n timeout 60 .gpu/bin/bench-transfer-cf4282e --only "1000 x" 2>&1
  done
done > "$OUT/rust_1000_abcd.txt"
grep -E "^==|H2D pageable|D2H pinned out" "$OUT/rust_1000_abcd.txt"
for b in lead512 piece128k cf4282e; do
  echo "== traced, $b"
  timeout 60 .gpu/bin/bench-transfer-$b --only "1000 x" --trace 2>&1
done > "$OUT/rust_trace.txt"
grep -E "^==|trace 1000 x 1 KiB f32 h2d \(" "$OUT/rust_trace.txt" | cut -c1-400
for r in 1 2; do
  for b in cf4282e piece128k; do
    echo "== process $r, $b"
    timeout 60 .gpu/bin/bench-transfer-$b --only "3x224" 2>&1
  done
done > "$OUT/rust_images.txt"
grep -E "^==|H2D pageable|D2H pinned out" "$OUT/rust_images.txt"
