# Session 51, run 1 (HEAD 375c4cb plus probes): every test binary, the Python suite,
# held_drops.py (with torch's and DLPack's drop rows), unbind_ways.py.
cd "$(dirname "$0")/../../.."
bash .gpu/run-tests > $OUT/run-tests.log 2>&1; tail -1 $OUT/run-tests.log; grep -E "FAILED|panicked" $OUT/run-tests.log | head
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "FAILED|Error" $OUT/pytest.log | head -5
bash .gpu/with-python python3 benches/probes/held_drops.py > $OUT/held_drops.txt 2>&1
bash .gpu/with-python python3 benches/probes/unbind_ways.py > $OUT/unbind_ways.txt 2>&1
bash .gpu/with-python python3 benches/probes/unbind_ways.py >> $OUT/unbind_ways.txt 2>&1
cat $OUT/held_drops.txt $OUT/unbind_ways.txt
