#!/bin/bash
# Run Q (session 34), at 684e042 (the output region's export pointer): both Rust suites
# and the Python suite.
cd "$(dirname "$0")/.."
FINAL=$OUT; OUT=/tmp/rq; mkdir -p $OUT
trap 'tar czf $FINAL/runQ.tar.gz -C /tmp rq' EXIT
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED" $OUT/py.log | head -5)
