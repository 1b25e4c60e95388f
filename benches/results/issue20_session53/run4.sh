#!/usr/bin/env bash
# Session 53, run 4 (one H200; the binding with its own phase timer, `_native.last_split`):
# the Python suite, then many_split.py (the traced flat call's binding phases) in two
# processes.
cd "$(dirname "$0")/../../.."
PINLANE_REQUIRE_GPU=1 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; tail -3 $OUT/pytest.txt
for p in 1 2; do
  echo "=== process $p"; timeout 120 bash .gpu/with-python python3 benches/probes/many_split.py
done > $OUT/many_split.txt 2>&1; echo "many_split rc=$?"; cat $OUT/many_split.txt
