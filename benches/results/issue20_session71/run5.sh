#!/usr/bin/env bash
# Session 71, run 5: the suites on the final CUDA path (af811cc and 3006d1f: the Python
# D2H's wait for a producer event before torch-side work bounded by sync_wait, read with
# pinlane::wait_for_event, the engine's own wait; the page-locked registry's lookup
# dropping its lock before the block it may hold last). Not run in session 71.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
grep -E "sync_wait|FAILED" "$OUT/verify/pytest.log" | head -5
