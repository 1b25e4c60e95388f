# Session 50, run 7 (HEAD's engine): the peers bench three times (W, X, Y), each table
# with its process's speed (a pure-Python loop); then the Rust bench once (JSON).
cd "$(dirname "$0")/../../.."
bash .gpu/with-python true
for t in W X Y; do
  timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed" $OUT/py_compare_$t.txt | cut -c1-250
done
for t in W X Y; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_WXY.txt
timeout 200 .gpu/bin/bench-transfer --json $OUT/rust.json > $OUT/rust.txt 2>&1; echo "bench-transfer rc=$?"; grep -E "1 KiB|x 32 MiB" $OUT/rust.txt
