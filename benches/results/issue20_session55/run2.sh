#!/usr/bin/env bash
# Session 55, run 2 (one H200): H2D hands over from 512 KiB (was 1 MiB) and the binding's
# new marks; every test binary, the Python suite, then h2d_handover_ab.py in two
# processes and one_d2h_split.py once.
cd "$(dirname "$0")/../../.."
bash .gpu/run-tests > "$OUT/run_tests.txt" 2>&1; echo "run-tests rc=$?" >> "$OUT/run_tests.txt"
tail -2 "$OUT/run_tests.txt"; grep -E "FAILED|panicked" "$OUT/run_tests.txt" | head
PINLANE_REQUIRE_GPU=1 timeout 250 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"; tail -3 "$OUT/pytest.txt"
for p in 1 2; do
  echo "=== process $p"; timeout 150 bash .gpu/with-python python3 benches/probes/h2d_handover_ab.py 2>&1
done > "$OUT/h2d_handover_ab.txt"; cat "$OUT/h2d_handover_ab.txt"
timeout 60 bash .gpu/with-python python3 benches/probes/one_d2h_split.py > "$OUT/one_d2h_split.txt" 2>&1; cat "$OUT/one_d2h_split.txt"
