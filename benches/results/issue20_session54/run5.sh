#!/usr/bin/env bash
# Session 54, run 5 (one H200; the package of run 1, the handover tests' modes shared by
# both directions): the Python suite.
cd "$(dirname "$0")/../../.."
PINLANE_REQUIRE_GPU=1 timeout 250 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"; tail -3 "$OUT/pytest.txt"
