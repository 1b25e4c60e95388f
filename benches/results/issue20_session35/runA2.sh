#!/bin/bash
# Run A2 (session 35), right after run A on the same machine, at b489313: the Rust bench's
# 1 KiB rows traced, then benches/py_overhead.py (as sent to the device; outputs in runA2/).
mkdir -p $OUT/b; (.gpu/bin/bench-transfer --only "1 KiB" --trace --json $OUT/b/tiny.json > $OUT/b/tiny.txt 2>&1; echo rc=$?) ; PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 benches/py_overhead.py > $OUT/b/py_overhead.log 2>&1; echo rc=$?; grep -E "trace|1000 x 1 KiB|one 1 KiB" $OUT/b/tiny.txt | head -30
