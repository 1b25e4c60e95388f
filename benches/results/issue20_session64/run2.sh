#!/usr/bin/env bash
# Session 64, run 2 (ran at the session's end, when loans resumed). Carry .gpu after
# `../shared/gpu/pack --peers`, `bash tests/pack-shipped`, `bash benches/gpu_fold.sh`, with .gpu/extra/wheel63 holding
# the wheel of b7efecc (session 63's final code: `git checkout b7efecc -- python/src
# python/pinlane && python3 -m pip wheel --no-deps -w .gpu/extra/wheel63 ./python && git
# checkout HEAD -- python/src python/pinlane`). The GPU checks on the final code
# (benches/gpu_verify.sh all: every test binary, the Python suite, the shipped build,
# compute-sanitizer), then the session's new Python tests against b7efecc's wheel, where
# each should fail, then benches/probes/capture_probe.py (calls made while torch captures
# a CUDA graph).
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify" 2>&1 | tee "$OUT/verify-summary.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/w63 .gpu/extra/wheel63/*.whl
PINLANE_REQUIRE_GPU=1 PYTHONPATH=/tmp/w63 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  "python/tests/test_copy_into_gpu.py::test_destinations_torch_copies_are_checked_as_pinlanes_are" \
  "python/tests/test_copy_into_gpu.py::test_autograd_and_torch_pairs_as_copy_gives_them" \
  "python/tests/test_torch_gpu.py::test_tensor_subclasses_arrive_with_the_class_and_metadata_torch_gives_them" \
  > "$OUT/old_wheel.txt" 2>&1
echo "old wheel (b7efecc) on the new tests: pytest exit $?" | tee -a "$OUT/verify-summary.txt"
grep -E "^(FAILED|E  )|passed|failed" "$OUT/old_wheel.txt" | head -20
timeout 200 bash .gpu/with-python python3 benches/probes/capture_probe.py > "$OUT/capture_probe.txt" 2>&1
echo "capture_probe rc=$?"; cat "$OUT/capture_probe.txt"
