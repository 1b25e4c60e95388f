#!/usr/bin/env bash
# Session 65, run 1. Carry .gpu after `../shared/gpu/pack --peers`, `bash tests/pack-shipped`,
# `bash benches/gpu_fold.sh`, with .gpu/extra/wheel64 holding the wheel of 2e74cb1
# (session 64's final code, built from a worktree). The GPU checks on 4d003c8 (the capture
# refusal, a wait refused on the completion thread, lending refused in a forked child:
# benches/gpu_verify.sh all), the
# new Python capture test against 2e74cb1's wheel (each way should fail there), benches/probes/capture_probe.py (calls made while
# torch captures a CUDA graph) and benches/probes/capture_query.cu (the check's cost).
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify" 2>&1 | tee "$OUT/verify-summary.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/w64 .gpu/extra/wheel64/*.whl
PINLANE_REQUIRE_GPU=1 PYTHONPATH=/tmp/w64 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  "python/tests/test_copy_into_gpu.py::test_calls_inside_a_graph_capture_are_refused" \
  > "$OUT/old_wheel.txt" 2>&1
echo "old wheel (2e74cb1) on the new test: pytest exit $?" | tee -a "$OUT/verify-summary.txt"
grep -E "^(FAILED|E  )|passed|failed" "$OUT/old_wheel.txt" | head -20
timeout 200 bash .gpu/with-python python3 benches/probes/capture_probe.py > "$OUT/capture_probe.txt" 2>&1
echo "capture_probe rc=$?"; cat "$OUT/capture_probe.txt"
(cd benches/probes && nvcc -O3 -arch=sm_90 -o /tmp/capture_query capture_query.cu -lcuda) && /tmp/capture_query > "$OUT/capture_query.txt" 2>&1
echo "capture_query rc=$?"; cat "$OUT/capture_query.txt"
