#!/usr/bin/env bash
# Session 61, run 5 (a fresh machine; carry .gpu after ../shared/gpu/pack --peers,
# tests/pack-shipped and benches/gpu_fold.sh on aca8fe7, whose staging window fills are cut
# into pieces of at least 128 KiB, plus .gpu/bin/bench-transfer-{cf4282e,w64,w256}: the
# bench built on cf4282e (16 KiB, every job) and on aca8fe7 with 64 and 256 KiB):
#   1. the Rust bench's 1 KiB rows, the four builds in turn, four rounds; the images' rows
#      of cf4282e and aca8fe7 in turn, three rounds;
#   2. every check of aca8fe7's CUDA path (benches/gpu_verify.sh all).
cd "$(dirname "$0")/../../.."
for r in 1 2 3 4; do
  for b in bench-transfer-cf4282e bench-transfer-w64 bench-transfer bench-transfer-w256; do
    echo "== process $r, $b"
    timeout 60 .gpu/bin/$b --only "1 KiB" 2>&1
  done
done > "$OUT/rust_small_w.txt"
grep -E "^==|1000 x 1 KiB f32           H2D pageable" "$OUT/rust_small_w.txt"
for r in 1 2 3; do
  for b in bench-transfer-cf4282e bench-transfer; do
    echo "== process $r, $b"
    timeout 60 .gpu/bin/$b --only "3x224" 2>&1
  done
done > "$OUT/rust_images_w.txt"
grep -E "^==|H2D pageable" "$OUT/rust_images_w.txt"
bash benches/gpu_verify.sh all "$OUT/verify"
