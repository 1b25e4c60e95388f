#!/bin/bash
# Run A (session 35), at b489313: both Rust suites, the Python suite, and the
# sanitizers on the round-trip and copy-into binaries.
cd "$(dirname "$0")/../../.."
FINAL=$OUT; OUT=/tmp/ra; mkdir -p $OUT
trap 'tar czf $FINAL/runA.tar.gz -C /tmp ra' EXIT
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED" $OUT/py.log | head -5)
for t in "gpu_roundtrip memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck" "gpu_into memcheck --leak-check full"; do
  set -- $t; b=$1; shift; tool=$1
  f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
  PINLANE_REQUIRE_GPU=1 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool "$@" .gpu/shipped/$f > $OUT/san_${b}_$tool.log 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_${b}_$tool.log | tail -1) $(grep -E '^test result' $OUT/san_${b}_$tool.log | tail -1 | cut -c1-40)"
done
