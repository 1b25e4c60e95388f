# Session 51, run 5 (the binding keeps torch.Tensor's exchange table per process and reads
# LOCAL_RANK with no second allocation): the Python suite, then the peers bench three
# times (G, H, I).
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "FAILED|Error" $OUT/pytest.log | head -5
for t in G H I; do
  timeout 110 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed" $OUT/py_compare_$t.txt | cut -c1-250
done
for t in G H I; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_GHI.txt
