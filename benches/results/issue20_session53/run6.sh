#!/usr/bin/env bash
# Session 53, run 6 (one H200; the read-through's mends: the phase timer's flat entries
# hand the arming on when they turn a batch away; mark_page_locked private): the Python
# suite.
cd "$(dirname "$0")/../../.."
PINLANE_REQUIRE_GPU=1 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; tail -3 $OUT/pytest.txt
