#!/usr/bin/env bash
# Session 68, run 5: the final library (benches/gpu_verify.sh all: test binaries, Python
# suite, shipped build, sanitizer), then async_small of three builds in turn, three
# rounds: c07094a (session 67's final), e5adc82 (the wait finishes its call), and this one
# (also: a waited call's event kept for the next call).
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify"
for i in 1 2 3; do
  for b in c07094a e5adc82 new; do
    if [ $b = new ]; then bin=.gpu/bin/bench-async_small; else bin=.gpu/extra/bench-async_small_$b; fi
    echo "=== round $i $b" >> "$OUT/async_small.txt"
    timeout 60 $bin >> "$OUT/async_small.txt" 2>&1
  done
done
grep -E "===|1 KiB f32 .*(non-blocking|into)" "$OUT/async_small.txt" | sed 's/  */ /g' | cut -c1-70
