#!/usr/bin/env bash
# Session 66, run 3. Carry .gpu after `../shared/gpu/pack --peers`, `bash tests/pack-shipped`,
# `bash benches/gpu_fold.sh`, with .gpu/extra/old_no_foreign_waits: the new
# tests/gpu_no_foreign_waits.rs built against f1fd40e (before registrations were ended off
# pinlane's threads; `cargo test --all-features --release --no-run --test
# gpu_no_foreign_waits` in a worktree, stripped). The GPU checks on the final code
# (benches/gpu_verify.sh all), then the old build of the new test, which should fail.
cd "$(dirname "$0")/../../.." || exit 1
# PART: all (default), or tests when little device time is left.
bash benches/gpu_verify.sh "${PART:-all}" "$OUT/verify" 2>&1 | tee "$OUT/verify-summary.txt"
grep -A12 "transfers_do_not_wait_for_other_streams\|no_foreign" "$OUT/verify/tests.log" | grep -E "ms$|test result" | head -12
PINLANE_REQUIRE_GPU=1 timeout 60 .gpu/extra/old_no_foreign_waits --nocapture > "$OUT/old_no_foreign_waits.txt" 2>&1
echo "old build (f1fd40e) of the new test: exit $?" | tee -a "$OUT/verify-summary.txt"
grep -E "ms$|test result|panicked|took" "$OUT/old_no_foreign_waits.txt" | head -12
