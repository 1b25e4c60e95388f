#!/usr/bin/env bash
# Session 55, run 6 (one H200; the wheel of 5d8929a, unchanged since): the Python suite,
# with the new test of a garbage collection calling pinlane inside the handover.
cd "$(dirname "$0")/../../.."
PINLANE_REQUIRE_GPU=1 timeout 250 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"; tail -3 "$OUT/pytest.txt"
PINLANE_REQUIRE_GPU=1 timeout 100 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py -k "garbage_collection or hands_over" -v > "$OUT/pytest_new.txt" 2>&1; tail -8 "$OUT/pytest_new.txt"
