# Session 50, run 11 (the final test file: the control's calls wait ~1 ms on their stream;
# a failed held check reports call times, fallbacks, counters and one call's marks): the
# Python suite, then the two held-GIL tests alone twice.
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "^E |Failed:|FAILED" $OUT/pytest.log | cut -c1-3000 | head -8
for i in 1 2; do
  bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py -k "small_d2h_calls" 2>&1 | grep -E "passed|failed|Failed:" | cut -c1-3000
done
