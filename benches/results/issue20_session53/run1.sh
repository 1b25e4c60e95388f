#!/usr/bin/env bash
# Session 53, run 1 (one H200): every test binary, the Python suite, then the probes
# one_list_ab.py and idle_split.py in two processes each.
set -u
bash .gpu/run-tests > "$OUT/run_tests.txt" 2>&1; echo "run-tests rc=$?" >> "$OUT/run_tests.txt"
PINLANE_REQUIRE_GPU=1 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"
for p in 1 2; do
  echo "=== process $p" >> "$OUT/one_list_ab.txt"
  bash .gpu/with-python python3 benches/probes/one_list_ab.py >> "$OUT/one_list_ab.txt" 2>&1
  echo "=== process $p" >> "$OUT/idle_split.txt"
  bash .gpu/with-python python3 benches/probes/idle_split.py >> "$OUT/idle_split.txt" 2>&1
done
tail -3 "$OUT/run_tests.txt" "$OUT/pytest.txt"
cat "$OUT/one_list_ab.txt"
