#!/bin/bash
# Session 49, issue 20. Run on the H200 from the repository root with $OUT set; each
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
old_too() { # the wheel in .gpu/alt as /tmp/old, the new one as /tmp/site
  bash .gpu/with-python true
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/alt/*.whl
}
ab() { # probe rounds: the old and the new package in turn
  for i in $(seq 1 $2); do
    for v in old site; do
      PYTHONPATH=/tmp/$v timeout 60 python3 benches/probes/$1.py $v$i >> $OUT/$1.txt 2>&1; echo "$1 $v$i rc=$?"
    done
  done
  grep -v "^$" $OUT/$1.txt | cut -c1-220
}
# Part 1 (the GIL kept through small D2H calls, `d2h_held`; the one-tensor short way in
# the public calls; 0cfdda2's wheel in .gpu/alt): every test binary, the Python suite,
# benches/probes/one_small_ab.py and gil_contention.py, old and new in turn.
if [ $PART = 1 ]; then
  rust_tests
  py_tests
  old_too
  ab one_small_ab 3
  ab gil_contention 2
fi
# Part 2 (the same engine as part 1; the Python half's one-tensor check without the
# `_single` call; the fixed GPU test and probe): the Python suite; one_small_ab.py old and
# new in turn x2; spdl_compare three times (Q, R, S), the tables in one file.
if [ $PART = 2 ]; then
  py_tests
  old_too
  ab one_small_ab 2
  for t in Q R S; do
    timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
    grep -E "^\| [0-9o]|limit" $OUT/py_compare_$t.txt | cut -c1-250
  done
  for t in Q R S; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_QRS.txt
fi
# Part 3 (bfd2be4's code, as part 2): where one small call's time goes now, old (0cfdda2)
# and new in turn x2: benches/py_overhead.py's one-tensor pieces and its split of small
# calls (whole call, native call, the engine's traced part); then the Rust bench's rows of
# 1 KiB tensors, traced, twice.
if [ $PART = 3 ]; then
  old_too
  for i in 1 2; do
    for v in old site; do
      echo "=== $v$i" >> $OUT/split.txt
      PYTHONPATH=/tmp/$v timeout 90 python3 -c "import runpy; m = runpy.run_path('benches/py_overhead.py', run_name='probe'); m['one_tensor'](); m['small_call_split']()" >> $OUT/split.txt 2>&1; echo "split $v$i rc=$?"
    done
  done
  grep -E "^===|d2h|D2H|d.cpu|copy_|to\('cuda'\)" $OUT/split.txt | cut -c1-200
  for i in 1 2; do
    timeout 60 .gpu/bin/bench-transfer --only "1 KiB f32" --trace > $OUT/bench_small_$i.txt 2>&1; echo "bench small $i rc=$?"
    grep -E "^\| *(1 x|1000 x)|D2H" $OUT/bench_small_$i.txt | head -8 | cut -c1-200
  done
fi
# Part 4 (bfd2be4's wheel): benches/probes/one_d2h_split.py, twice.
if [ $PART = 4 ]; then
  for i in 1 2; do
    timeout 120 bash .gpu/with-python python3 benches/probes/one_d2h_split.py > $OUT/split_$i.txt 2>&1; echo "split $i rc=$?"
    cat $OUT/split_$i.txt
  done
fi
# Part 5 (the final code: every blocking part of a held D2H inside around_wait): every
# test binary, the Python suite, one_small_ab.py and gil_contention.py, old (0cfdda2) and
# new in turn.
if [ $PART = 5 ]; then
  rust_tests
  py_tests
  old_too
  ab one_small_ab 1
  ab gil_contention 1
fi
# Part 6 (the final code): spdl_compare three times (T, U, V), the tables in one file.
if [ $PART = 6 ]; then
  bash .gpu/with-python true
  for t in T U V; do
    timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
    grep -E "^\| [0-9o]|limit" $OUT/py_compare_$t.txt | cut -c1-250
  done
  for t in T U V; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_TUV.txt
fi
# Part 7 (the final code): one_d2h_split.py with the peers bench's forms of the call, twice;
# `python -m pinlane.bench` on the one-tensor batch alone (the peers bench's way of timing,
# way after way in blocks, in a fresh process), twice.
if [ $PART = 7 ]; then
  for i in 1 2; do
    timeout 120 bash .gpu/with-python python3 benches/probes/one_d2h_split.py > $OUT/split_$i.txt 2>&1; echo "split $i rc=$?"
    cat $OUT/split_$i.txt
  done
  for i in 1 2; do
    timeout 120 bash .gpu/with-python python3 -m pinlane.bench --batch 1x256:float32 > $OUT/bench_one_$i.txt 2>&1; echo "bench one $i rc=$?"
    grep -E "^\| 1 x" $OUT/bench_one_$i.txt
  done
fi
# Part 8 (the final code): one_d2h_split.py with device tensors made by pinlane's H2D and by
# torch, four in turn, twice.
if [ $PART = 8 ]; then
  for i in 1 2; do
    timeout 120 bash .gpu/with-python python3 benches/probes/one_d2h_split.py > $OUT/split_$i.txt 2>&1; echo "split $i rc=$?"
    cat $OUT/split_$i.txt
  done
fi
# Part 9 (the final code): benches/probes/blocks_order.py, twice.
if [ $PART = 9 ]; then
  for i in 1 2; do
    timeout 120 bash .gpu/with-python python3 benches/probes/blocks_order.py > $OUT/blocks_$i.txt 2>&1; echo "blocks $i rc=$?"
    cat $OUT/blocks_$i.txt
  done
fi
# Part 10 (the final code after the second review): every test binary and the Python suite.
if [ $PART = 10 ]; then
  rust_tests
  py_tests
fi
