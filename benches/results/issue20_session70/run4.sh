#!/usr/bin/env bash
# Session 70, run 4: the Rust bench's one 1 KiB calls traced, with finer D2H marks than the
# committed code has ("fine: ..." marks after each step of engine/d2h.rs's transfer and
# into_block, added for this run and taken back after it; the binary was carried as
# .gpu/fine/bench-transfer), beside the committed bench of d65e153, three processes each.
cd "$(dirname "$0")/../../.." || exit 1
for p in 1 2 3; do
  echo "== fine process $p"
  .gpu/fine/bench-transfer --trace --only "1 x 1 KiB" 2>&1 | grep -E "trace 1 x 1 KiB f32 (d2h|h2d) \(|whole calls|D2H pinned out|H2D pageable"
  echo "== old process $p"
  .gpu/bin/bench-transfer --only "1 x 1 KiB" 2>&1 | grep -E "D2H pinned out|H2D pageable"
done > "$OUT/fine.txt" 2>&1
cat "$OUT/fine.txt"
