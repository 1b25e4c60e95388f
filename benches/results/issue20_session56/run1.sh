#!/usr/bin/env bash
# Session 56, run 1 (one H200): every test binary and the Python suite on the new gate
# (a non-blocking H2D call's outputs ordered after its event) and the binding's two
# per-call savings.
cd "$(dirname "$0")/../../.."
bash .gpu/run-tests > "$OUT/run_tests.txt" 2>&1; echo "run-tests rc=$?" >> "$OUT/run_tests.txt"
tail -2 "$OUT/run_tests.txt"; grep -E "FAILED|panicked" "$OUT/run_tests.txt" | head
PINLANE_REQUIRE_GPU=1 timeout 250 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"; tail -3 "$OUT/pytest.txt"
