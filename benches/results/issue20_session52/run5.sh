# Session 52, run 5 (269a47c's package, the probe with its views=False row): images_split
# once, then the peers bench twice (D, E) with run 1's Rust figures beside.
cd "$(dirname "$0")/../../.."
timeout 100 bash .gpu/with-python python3 benches/probes/images_split.py > $OUT/images_split.txt 2>&1; echo "images_split rc=$?"; cat $OUT/images_split.txt
for t in D E; do
  timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json --rust benches/results/issue20_session52/run1/rust.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed|rounds" $OUT/py_compare_$t.txt | cut -c1-300
done
for t in D E; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_DE.txt
