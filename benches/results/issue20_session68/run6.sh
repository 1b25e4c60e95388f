#!/usr/bin/env bash
# Session 68, run 6: is the one 1 KiB blocking H2D slower in this session's builds (runs 2
# and 5 put it 1 to 4 us above c07094a's, with c07094a's process always first)? The
# final library's async_small with and without the copy-into check (`--no-into`), and
# c07094a's, in rotated orders, three rounds.
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
run() {
  case $1 in
    old) bin=".gpu/extra/bench-async_small_c07094a" ;;
    new) bin=".gpu/extra/bench-async_small_noin" ;;
    noin) bin=".gpu/extra/bench-async_small_noin --no-into" ;;
  esac
  echo "=== round $2 $1" >> "$OUT/async_small.txt"
  timeout 60 $bin >> "$OUT/async_small.txt" 2>&1
}
for order in "new old noin" "old noin new" "noin new old" "new noin old"; do
  i=$((i + 1))
  for b in $order; do run $b $i; done
done
grep -E "===|f32 (H2D|D2H) blocking" "$OUT/async_small.txt" | sed 's/  */ /g' | cut -c1-50
