#!/bin/bash
# Run E (session 37), at 616af82 (the caller's spin limited to jobs of up to 2 MiB), after
# the last change to the engine: both Rust GPU suites, the Python suite, compute-sanitizer
# memcheck (gpu_semantics, gpu_roundtrip, gpu_into), initcheck (gpu_roundtrip), synccheck
# (gpu_into).
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/re; mkdir -p $OUT
trap 'tar czf $FINAL/runE.tar.gz -C /tmp re' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log; grep -E "FAILED|panicked" $OUT/rust.log | head -5)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED|Error" $OUT/py.log | head -8)
for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
  PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool "$@" .gpu/shipped/$f > $OUT/san_${b}_$tool.log 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_${b}_$tool.log | tail -1) $(grep -E '^test result' $OUT/san_${b}_$tool.log | tail -1 | cut -c1-40)"
done
