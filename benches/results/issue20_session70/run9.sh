#!/usr/bin/env bash
# Session 70, run 9: the suites on 8fa1f3b (the read-through's rewrite of the kept blocks'
# consumer as one enum), and the probes that now share probe.h's spin_flag compiled and
# run once each (legacy_order.cu's first rows, wait_floor.cu's first rows).
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
cd benches/probes || exit 1
for p in legacy_order wait_floor after_kernel small_floor; do
  nvcc -O3 -arch=sm_90 -o /tmp/$p $p.cu -lcuda > /tmp/$p.build 2>&1 && echo "$p built" || { echo "$p FAILED to build"; tail -5 /tmp/$p.build; }
done > "$OUT/probes.txt" 2>&1
(timeout 60 /tmp/legacy_order | head -4; timeout 60 /tmp/wait_floor | head -6) >> "$OUT/probes.txt" 2>&1
cat "$OUT/probes.txt"
