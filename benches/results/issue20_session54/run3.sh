#!/usr/bin/env bash
# Session 54, run 3 (two H200s, kind nvidia-h200-x2; the code of run 1): every test binary
# with both GPUs visible, then again with LOCAL_RANK=1 (the suite on the second GPU), and
# the Python suite with LOCAL_RANK=1.
cd "$(dirname "$0")/../../.."
set -u
nvidia-smi -L
bash .gpu/run-tests > "$OUT/run_tests_rank0.txt" 2>&1; echo "run-tests (rank 0) rc=$?"; tail -1 "$OUT/run_tests_rank0.txt"
grep -E "FAILED|panicked" "$OUT/run_tests_rank0.txt" | head
LOCAL_RANK=1 bash .gpu/run-tests > "$OUT/run_tests_rank1.txt" 2>&1; echo "run-tests (LOCAL_RANK=1) rc=$?"; tail -1 "$OUT/run_tests_rank1.txt"
grep -E "FAILED|panicked" "$OUT/run_tests_rank1.txt" | head
LOCAL_RANK=1 PINLANE_REQUIRE_GPU=1 timeout 240 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest_rank1.txt" 2>&1
echo "pytest (LOCAL_RANK=1) rc=$?"; tail -3 "$OUT/pytest_rank1.txt"
