#!/usr/bin/env bash
# Session 72, run 2: the Python suite with torch again, after run 1's one failure
# (test_the_producer_events_wait_before_torch_work_is_bounded_by_sync_wait: the device's
# first transfer loaded pinlane's kernels, and cuModuleLoadData waited out the test's
# 1 s device sleep before the bounded wait began; the test now transfers once first).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "L3"
mkdir -p $OUT/v
for d in tests shipped; do [ -d .gpu/$d ] || python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('.gpu', filter='tar')" .gpu/$d.tar.xz; done
PINLANE_REQUIRE_GPU=1 timeout 250 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/v/pytest.log 2>&1
echo "pytest rc=$? $(tail -1 $OUT/v/pytest.log)"
grep -E "FAILED|producer_events_wait" $OUT/v/pytest.log | head
