#!/usr/bin/env bash
# Session 54, run 1 (one H200; H2D's outputs handed to torch while its copies run: the
# engine's transfer_tensor_h2d_overlapping and the binding's use of it): every test
# binary, the Python suite, then h2d_handover_ab.py in two processes.
cd "$(dirname "$0")/../../.."
set -u
nvidia-smi -L
bash .gpu/run-tests > "$OUT/run_tests.txt" 2>&1; echo "run-tests rc=$?" >> "$OUT/run_tests.txt"
tail -2 "$OUT/run_tests.txt"; grep -E "FAILED|panicked" "$OUT/run_tests.txt" | head
PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.txt"; tail -3 "$OUT/pytest.txt"
for p in 1 2; do
  echo "=== process $p"; timeout 120 bash .gpu/with-python python3 benches/probes/h2d_handover_ab.py 2>&1
done > "$OUT/h2d_handover_ab.txt"; echo "probe rc=$?"; cat "$OUT/h2d_handover_ab.txt"
