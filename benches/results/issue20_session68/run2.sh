#!/usr/bin/env bash
# Session 68, run 2: the wait that finishes its own call (Transfer::wait asks the event for
# up to Config::spin): GPU test binaries and the Python suite (gpu_verify.sh tests);
# async_small, session 67's final build (c07094a, .gpu/extra/bench-async_small_c07094a)
# and this one in turn, three processes each; tests/gpu_no_foreign_waits.rs with its
# step times, two processes; the probe free_hold.cu.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh tests "$OUT/verify"
for i in 1 2 3; do
  for b in old new; do
    if [ $b = old ]; then bin=.gpu/extra/bench-async_small_c07094a; else bin=.gpu/bin/bench-async_small; fi
    echo "=== round $i $b" >> "$OUT/async_small.txt"
    timeout 60 $bin >> "$OUT/async_small.txt" 2>&1
  done
done
grep -E "===|non-blocking|blocking|into" "$OUT/async_small.txt" | grep -v limit | head -80
t=$(ls .gpu/tests/ | grep no_foreign | head -1)
for i in 1 2; do
  PINLANE_REQUIRE_GPU=1 timeout 30 ".gpu/tests/$t" --nocapture > "$OUT/no_foreign_waits$i.txt" 2>&1
  echo "process $i: exit $?"; grep -E " ms$|test result" "$OUT/no_foreign_waits$i.txt" | cut -c1-120
done
nvcc -O3 -arch=sm_90 -o /tmp/free_hold benches/probes/free_hold.cu -lcuda && timeout 150 /tmp/free_hold > "$OUT/free_hold.txt" 2>&1
echo "probe rc=$?"; cat "$OUT/free_hold.txt"
