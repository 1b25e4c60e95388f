#!/bin/bash
# Session 48, issue 20. Run on the H200 from the repository root with $OUT set; each
# part writes straight into $OUT/partN (at most 8 files come back from $OUT).
cd "$(dirname "$0")/../../.."
PART=${1:-1}
OUT=$OUT/part$PART; mkdir -p $OUT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
rust_tests() {
  bash .gpu/run-tests > $OUT/rust.log 2>&1
  echo "tests rc=$? $(tail -1 $OUT/rust.log)"
  grep -E "FAILED|panicked" $OUT/rust.log | head -5
}
py_tests() {
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
}
gil() { # rounds
  bash .gpu/with-python true
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/alt/*.whl
  for i in $(seq 1 $1); do
    for v in old site; do
      PYTHONPATH=/tmp/$v timeout 45 python3 benches/probes/gil_contention.py $v$i >> $OUT/gil.txt 2>&1; echo "gil $v$i rc=$?"
    done
  done
  grep -v "^$" $OUT/gil.txt | sort -k2 -s | cut -c1-200
}
why() { # tag args...
  local tag=$1; shift
  timeout 120 bash .gpu/with-python python3 benches/probes/d2h_rounds_why.py "$@" > $OUT/why_$tag.txt 2>&1; echo "d2h_rounds_why $tag rc=$?"
  cut -c1-200 $OUT/why_$tag.txt
}
# Part 1 (e7c03bb, session 47's last code, first time on the GPU): every test binary,
# the Python suite, then session 47's part 8: benches/probes/gil_contention.py with
# 9c77d0c's wheel (.gpu/alt, before the D2H handover) and e7c03bb's in turn x2; then
# benches/probes/d2h_rounds_why.py with the table by predecessor, twice, 120 rounds.
if [ $PART = 1 ]; then
  rust_tests
  py_tests
  gil 2
  why a --no-cpu --rounds 120
  why b --no-cpu --rounds 120
fi
# Part 2 (flat batches: python/pinlane/_tree.py's flat dicts, `_native.d2h_flat`/`h2d_flat`):
# the Python suite with the new wheel; d2h_rounds_why.py with e7c03bb's wheel (.gpu/alt,
# "old"), the same with the new _tree.py copied over ("mid") and the new wheel ("site"),
# in turn x2; spdl_compare once (N).
if [ $PART = 2 ]; then
  py_tests
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/alt/*.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mid .gpu/alt/*.whl
  cp python/pinlane/_tree.py /tmp/mid/pinlane/_tree.py
  for i in 1 2; do
    for v in old mid site; do
      echo "=== $v$i" >> $OUT/why_ab.txt
      PYTHONPATH=/tmp/$v timeout 60 python3 benches/probes/d2h_rounds_why.py --no-cpu --rounds 60 >> $OUT/why_ab.txt 2>&1; echo "why $v$i rc=$?"
    done
  done
  grep -E "^===|^pinlane (dict|list|native) |^torch pinned |^floor x1 " $OUT/why_ab.txt
  timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_N.json > $OUT/py_compare_N.txt 2>&1; echo "spdl_compare N rc=$?"
  grep -E "^\| [0-9o]|limit" $OUT/py_compare_N.txt | cut -c1-250
fi
# Part 3 (851dc09, the final code): spdl_compare twice more (O, P), the two tables in one
# file.
if [ $PART = 3 ]; then
  bash .gpu/with-python true
  for t in O P; do
    timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
    grep -E "^\| [0-9o]|limit" $OUT/py_compare_$t.txt | cut -c1-250
  done
  for t in O P; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_OP.txt
fi
# Part 4 (851dc09): benches/probes/gil_pieces.py, the pieces of a D2H call alone and under
# a busy Python thread.
if [ $PART = 4 ]; then
  timeout 150 bash .gpu/with-python python3 benches/probes/gil_pieces.py > $OUT/gil_pieces.txt 2>&1; echo "gil_pieces rc=$?"
  cat $OUT/gil_pieces.txt
fi
# Part 5 (the Rust engine is session 47's, 1589b43's): the Rust bench's rows of one and of
# 1000 tensors of 1 KiB, traced, in three processes, on this session's machine.
if [ $PART = 5 ]; then
  for i in 1 2 3; do
    timeout 60 .gpu/bin/bench-transfer --only "1 KiB f32" --trace > $OUT/bench_small_$i.txt 2>&1; echo "bench small $i rc=$?"
    grep -E "^1000 x|^1 x|limit" $OUT/bench_small_$i.txt | cut -c1-110
  done
fi
# Part 6 (851dc09): benches/probes/flat_ab.py with e7c03bb's wheel (.gpu/alt, "old") and
# 851dc09's ("site") in turn x3.
if [ $PART = 6 ]; then
  bash .gpu/with-python true
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/alt/*.whl
  for i in 1 2 3; do
    for v in old site; do
      PYTHONPATH=/tmp/$v timeout 60 python3 benches/probes/flat_ab.py $v$i >> $OUT/flat_ab.txt 2>&1; echo "flat_ab $v$i rc=$?"
    done
  done
  sort -s -k1.2,1.4 $OUT/flat_ab.txt | cut -c1-260
fi
