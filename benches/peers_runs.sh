#!/bin/bash
# Issue 20's peers bench as each session runs it, on the GPU machine: the Rust bench once
# (JSON), then benches/spdl_compare.py three times (A, B, C) with the Rust figures beside.
# Logs into directory $1: rust.json, rust.txt, py_compare_{A,B,C}.json and all three
# outputs in py_compare_ABC.txt. Prints the tables. About 7 to 9 minutes.
# Carry .gpu after `../shared/gpu/pack --peers` with .gpu/tests moved aside.
# Run from the project root: bash benches/peers_runs.sh "$OUT"
out=${1:?usage: peers_runs.sh LOG_DIR}
mkdir -p "$out"
timeout 170 .gpu/bin/bench-transfer --json "$out/rust.json" > "$out/rust.txt" 2>&1
echo "bench-transfer rc=$?"; grep -E "1 KiB|x 32 MiB|3x224" "$out/rust.txt"
for t in A B C; do
  timeout 140 bash .gpu/with-python python3 benches/spdl_compare.py --json "$out/py_compare_$t.json" \
    --rust "$out/rust.json" > "$out/py_compare_$t.txt" 2>&1
  echo "spdl_compare $t rc=$?"
  grep -E "^\| [0-9o]|limit|speed|rounds" "$out/py_compare_$t.txt" | cut -c1-300
done
for t in A B C; do echo "=== spdl_compare $t"; cat "$out/py_compare_$t.txt"; rm "$out/py_compare_$t.txt"; done > "$out/py_compare_ABC.txt"
