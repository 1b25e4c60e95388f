#!/bin/bash
# Run R (session 34), at the review mends: both Rust suites
# and the Python suite.
cd "$(dirname "$0")/.."
FINAL=$OUT; OUT=/tmp/rr; mkdir -p $OUT
trap 'tar czf $FINAL/runR.tar.gz -C /tmp rr' EXIT
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED" $OUT/py.log | head -5)
f=$(ls .gpu/shipped/ | grep "^gpu_roundtrip" | head -1)
PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --leak-check full .gpu/shipped/$f > $OUT/san_gpu_roundtrip_memcheck.log 2>&1; echo "gpu_roundtrip memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_gpu_roundtrip_memcheck.log | tail -1) $(grep -E '^test result' $OUT/san_gpu_roundtrip_memcheck.log | tail -1 | cut -c1-40)"
