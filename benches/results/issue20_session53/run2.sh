#!/usr/bin/env bash
# Session 53, run 2 (one H200; the package with the list-of-one short way and Pairs
# asking the driver): many_split.py in two processes, the Rust bench once (JSON), then the
# peers bench three times (A, B, C) with the Rust figures beside.
cd "$(dirname "$0")/../../.."
for p in 1 2; do
  echo "=== process $p"; timeout 100 bash .gpu/with-python python3 benches/probes/many_split.py
done > $OUT/many_split.txt 2>&1; echo "many_split rc=$?"; cat $OUT/many_split.txt
timeout 170 .gpu/bin/bench-transfer --json $OUT/rust.json > $OUT/rust.txt 2>&1; echo "bench-transfer rc=$?"; grep -E "1 KiB|x 32 MiB|3x224" $OUT/rust.txt
for t in A B C; do
  timeout 140 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json --rust $OUT/rust.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed|rounds" $OUT/py_compare_$t.txt | cut -c1-300
done
for t in A B C; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_ABC.txt
