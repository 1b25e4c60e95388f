# Session 51, run 4 (8b0750f's package, the split guard in): whether the new autograd test
# fails without the guard (rows_autograd_without_guard.py), the Rust bench once (JSON),
# then the peers bench three times (D, E, F) with the Rust figures beside (--rust).
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 benches/probes/rows_autograd_without_guard.py 2>&1 | tee $OUT/rows_autograd.txt
timeout 170 .gpu/bin/bench-transfer --json $OUT/rust.json > $OUT/rust.txt 2>&1; echo "bench-transfer rc=$?"; grep -E "1 KiB|x 32 MiB|3x224" $OUT/rust.txt
for t in D E F; do
  timeout 110 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json --rust $OUT/rust.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed" $OUT/py_compare_$t.txt | cut -c1-300
done
for t in D E F; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_DEF.txt
