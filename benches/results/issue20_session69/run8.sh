#!/usr/bin/env bash
# Session 69, run 8: the kept small device blocks from Python. benches/probes/one_small_ab.py
# (pinlane's small calls against torch's in rounds, one process) with
# pinlane.configure(small_device_blocks=0) (each output freed at once, as before) and with
# the default, in turn, three rounds. Carry: the .gpu of run 7.
cd "$(dirname "$0")/../../.." || exit 1
bash .gpu/with-python bash -c '
for r in 1 2 3; do
  for v in 0 8; do
    timeout 120 python3 -c "
import runpy, sys, pinlane
pinlane.configure(small_device_blocks=$v)
sys.argv = [\"one_small_ab.py\", \"round $r, small_device_blocks=$v\"]
runpy.run_path(\"benches/probes/one_small_ab.py\", run_name=\"__main__\")
"
  done
done' > "$OUT/py_ab.txt" 2>&1
grep -E "===|H2D|D2H" "$OUT/py_ab.txt"
