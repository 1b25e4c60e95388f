#!/usr/bin/env bash
# Session 54, run 8 (one H200; the binding marks "handed over" in its phase timer where it
# made the torch tensors in the hook, and the tests check it): the Python suite.
cd "$(dirname "$0")/../../.."
PINLANE_REQUIRE_GPU=1 timeout 250 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"; tail -3 "$OUT/pytest.txt"; grep -E "^(FAILED|E )" "$OUT/pytest.txt" | head -20
