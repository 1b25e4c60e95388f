#!/usr/bin/env bash
# Session 53, run 3 (one H200; the Rust crate unchanged since session 52's f5481d4, the
# package as run 2 plus many_split's spdl rows): the shipped build (`bash
# tests/pack-shipped`: default features plus proptest, no sim, no test-util) and
# compute-sanitizer on it; the Rust bench's traced 1 KiB rows (`--trace --only "1 x 1 KiB"`);
# many_split.py (now with spdl in the same process) in two processes.
cd "$(dirname "$0")/../../.."
nvidia-smi -L
bash .gpu/run-shipped > $OUT/run-shipped.txt 2>&1; echo "run-shipped rc=$?"; grep -E "^shipped test binaries|FAILED|panicked" $OUT/run-shipped.txt | head
for t in "gpu_foundations memcheck --leak-check full --report-api-errors no" "gpu_semantics memcheck --leak-check full" \
         "gpu_roundtrip memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  log="$OUT/sanitizer.txt"
  echo "=== $b $*" >> $log
  PINLANE_REQUIRE_GPU=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$b" >> "$log" 2>&1
  echo "$b $*: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-60)"
done
timeout 100 .gpu/bin/bench-transfer --trace --only "1 x 1 KiB" > $OUT/trace_1k.txt 2>&1; echo "bench-transfer --trace rc=$?"; cat $OUT/trace_1k.txt | cut -c1-200
for p in 1 2; do
  echo "=== process $p"; timeout 120 bash .gpu/with-python python3 benches/probes/many_split.py
done > $OUT/many_split.txt 2>&1; echo "many_split rc=$?"; cat $OUT/many_split.txt
