# Session 52, run 1 (b-rounds commit: the peers bench times the small batches in rounds;
# the package as session 51's HEAD 2a8b497 otherwise): the Python suite (verifies the
# unrun modes_active commit), the Rust bench once (JSON), then the peers bench twice (A, B).
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; tail -3 $OUT/pytest.txt
timeout 170 .gpu/bin/bench-transfer --json $OUT/rust.json > $OUT/rust.txt 2>&1; echo "bench-transfer rc=$?"; grep -E "1 KiB|x 32 MiB|3x224" $OUT/rust.txt
for t in A B; do
  timeout 140 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json --rust $OUT/rust.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed|rounds" $OUT/py_compare_$t.txt | cut -c1-300
done
for t in A B; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_AB.txt
