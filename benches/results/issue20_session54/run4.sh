#!/usr/bin/env bash
# Session 54, run 4 (two H200s, kind nvidia-h200-x2): the tests run 3 found assuming
# cuda:0 (sleeps on torch's current device, weights expected on cuda:0), mended, with
# LOCAL_RANK=1 and unset; then the shipped build (`bash tests/pack-shipped`: default
# features plus proptest, no sim, no test-util) and compute-sanitizer on it, on GPU 0.
cd "$(dirname "$0")/../../.."
set -u
nvidia-smi -L
sel="test_small_d2h_calls_keep_the_gil or hands_outputs_to_torch or kernels_read_h2d_outputs"
for r in 1 0; do
  echo "=== LOCAL_RANK=$r"
  LOCAL_RANK=$r PINLANE_REQUIRE_GPU=1 timeout 150 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider \
    python/tests/test_weights_gpu.py python/tests/test_torch_gpu.py -k "$sel or weights" 2>&1 | tail -4
done > "$OUT/pytest_mended.txt"; cat "$OUT/pytest_mended.txt"
bash .gpu/run-shipped > $OUT/run-shipped.txt 2>&1; echo "run-shipped rc=$?"; grep -E "^shipped test binaries|FAILED|panicked" $OUT/run-shipped.txt | head
for t in "gpu_foundations memcheck --leak-check full --report-api-errors no" "gpu_semantics memcheck --leak-check full" \
         "gpu_roundtrip memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  log="$OUT/sanitizer.txt"
  echo "=== $b $*" >> $log
  PINLANE_REQUIRE_GPU=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$b" >> "$log" 2>&1
  echo "$b $*: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-60)"
done
