# Session 50, run 10: the Python suite twice, then the two held-GIL tests alone three
# times each (fresh processes), then held_after_stream.py: to catch run 9's failure with
# the tests' new report (pageable fallbacks, counters, flags, one call's marks).
cd "$(dirname "$0")/../../.."
for i in 1 2; do
  bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest_$i.log 2>&1; tail -1 $OUT/pytest_$i.log; grep -E "^E |Failed:|FAILED" $OUT/pytest_$i.log | cut -c1-1500 | head -8
done
for i in 1 2 3; do
  bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py -k "small_d2h_calls" 2>&1 | tail -2
done > $OUT/alone.log; cat $OUT/alone.log | cut -c1-1500
bash .gpu/with-python python3 benches/probes/held_after_stream.py > $OUT/held_after_stream.log 2>&1; grep -o '"phase": "[^"]*"\|n[123]_progress_zero": [0-9]*\|"end_flags": [a-z]*\|"pageable_fallbacks": [0-9]*' $OUT/held_after_stream.log | tr '\n' ' '
