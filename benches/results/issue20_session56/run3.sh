#!/usr/bin/env bash
# Session 56, run 3 (one H200; the final engine and binding of the session): the Rust
# bench once (JSON), then the peers bench three times (A, B, C) with the Rust figures
# beside (as session 55's run 5).
cd "$(dirname "$0")/../../.."
timeout 170 .gpu/bin/bench-transfer --json $OUT/rust.json > $OUT/rust.txt 2>&1; echo "bench-transfer rc=$?"; grep -E "1 KiB|x 32 MiB|3x224" $OUT/rust.txt
for t in A B C; do
  timeout 140 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json --rust $OUT/rust.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed|rounds" $OUT/py_compare_$t.txt | cut -c1-300
done
for t in A B C; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_ABC.txt
