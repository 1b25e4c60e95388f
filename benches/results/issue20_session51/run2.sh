# Session 51, run 2 (the split guard: python/src/torch.rs `rows`): the Python suite,
# split_guard_ab.py in six processes (on/off in turn), the peers bench three times.
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "FAILED|Error" $OUT/pytest.log | head -5
for m in on off on off on off; do timeout 40 bash .gpu/with-python python3 benches/probes/split_guard_ab.py $m; done 2>&1 | tee $OUT/split_guard_ab.txt
for t in A B C; do
  timeout 110 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed" $OUT/py_compare_$t.txt | cut -c1-250
done
for t in A B C; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_ABC.txt
