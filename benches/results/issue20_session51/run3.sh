# Session 51, run 3 (one H200: the 2-GPU kind was not lent; the split guard looked up per run): every test
# binary, the Python suite, split_guard_ab.py twice (both modes in one
# process), compute-sanitizer on the GPU test binaries (memcheck with the leak check on
# gpu_semantics, gpu_roundtrip, gpu_into; initcheck on gpu_roundtrip; synccheck on gpu_into).
cd "$(dirname "$0")/../../.."
nvidia-smi -L
bash .gpu/run-tests > $OUT/run-tests.log 2>&1; tail -1 $OUT/run-tests.log; grep -E "FAILED|panicked" $OUT/run-tests.log | head
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "FAILED|Error" $OUT/pytest.log | head -5
for i in 1 2; do timeout 90 bash .gpu/with-python python3 benches/probes/split_guard_ab.py; done > $OUT/split_guard_ab.txt 2>&1; grep -E "median|speed" $OUT/split_guard_ab.txt
for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" \
         "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  log="$OUT/san.log"
  echo "=== $b $*" >> $log
  PINLANE_REQUIRE_GPU=1 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/tests/test-$b" >> "$log" 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-60)"
done
