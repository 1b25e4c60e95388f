# Session 50, run 8 (HEAD): the shipped GPU suite (no sim, no test-util) and
# compute-sanitizer, as benches/gpu_verify.sh (run 6 ran .gpu/run-tests and pytest).
cd "$(dirname "$0")/../../.."
bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$? $(tail -1 $OUT/shipped.log)"
for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" \
         "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  log="$OUT/san_${b}_$tool.log"
  PINLANE_REQUIRE_GPU=1 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$b" > "$log" 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-60)"
done
