#!/usr/bin/env bash
# Session 67, run 3. Carry .gpu after `../shared/gpu/pack --peers`, `bash tests/pack-shipped`,
# `bash benches/gpu_fold.sh`, with .gpu/extra/old_async_small: benches/async_small.rs built
# against 614fb44 (wake-ups still on the calls' streams; `cargo bench --all-features
# --no-run --bench async_small` in a worktree, stripped). The GPU checks on the final
# code (benches/gpu_verify.sh all), then the non-blocking small calls, old and new builds
# in turn, three processes each.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh "${PART:-all}" "$OUT/verify" 2>&1 | tee "$OUT/verify-summary.txt"
grep -A30 "transfers_do_not_wait_for_other_streams stdout\|no_foreign" "$OUT/verify/tests.log" | grep -E " ms$|test result" | head -24
for i in 1 2 3; do
  for b in old new; do
    exe=.gpu/bin/bench-async_small; [ $b = old ] && exe=.gpu/extra/old_async_small
    echo "== $b, process $i" >> "$OUT/async_small.txt"
    timeout 60 $exe >> "$OUT/async_small.txt" 2>&1
  done
done
cat "$OUT/async_small.txt"
