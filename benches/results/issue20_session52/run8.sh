# Session 52, run 8 (the write-up commit; the shipped build: default features plus
# proptest, no sim, no test-util, from `bash tests/pack-shipped`): every shipped GPU test
# binary, then compute-sanitizer on shipped binaries (memcheck with the leak check on
# gpu_foundations, gpu_semantics and gpu_roundtrip; initcheck on gpu_roundtrip; synccheck
# on gpu_into).
cd "$(dirname "$0")/../../.."
nvidia-smi -L
bash .gpu/run-shipped > $OUT/run-shipped.txt 2>&1; echo "run-shipped rc=$?"; grep -E "^shipped test binaries|FAILED|panicked" $OUT/run-shipped.txt | head
for t in "gpu_foundations memcheck --leak-check full" "gpu_semantics memcheck --leak-check full" \
         "gpu_roundtrip memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  log="$OUT/sanitizer.txt"
  echo "=== $b $*" >> $log
  PINLANE_REQUIRE_GPU=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$b" >> "$log" 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-60)"
done
