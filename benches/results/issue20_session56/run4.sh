#!/usr/bin/env bash
# Session 56, run 4 (one H200; the final engine of the session, the shipped build: `bash tests/pack-shipped`):
# every shipped GPU test binary, then compute-sanitizer on them.
cd "$(dirname "$0")/../../.."
bash .gpu/run-shipped > $OUT/run-shipped.txt 2>&1; echo "run-shipped rc=$?"; grep -E "^shipped test binaries|FAILED|panicked" $OUT/run-shipped.txt | head
for t in "gpu_foundations memcheck --leak-check full --report-api-errors no" "gpu_semantics memcheck --leak-check full" \
         "gpu_roundtrip memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift
  log="$OUT/sanitizer.txt"
  echo "=== $b $*" >> $log
  PINLANE_REQUIRE_GPU=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$b" >> "$log" 2>&1
  echo "$b $*: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-60)"
done
