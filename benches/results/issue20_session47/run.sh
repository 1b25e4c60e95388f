#!/bin/bash
# Session 47, issue 20. Run on the H200 from the repository root with $OUT set; each
# part writes straight into $OUT/partN.
cd "$(dirname "$0")/../../.."
PART=${1:-1}
OUT=$OUT/part$PART; mkdir -p $OUT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
compare() { # tag
  timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$1.json > $OUT/py_compare_$1.txt 2>&1; echo "spdl_compare $1 rc=$?"
  grep -E "^\| [0-9o]|limit" $OUT/py_compare_$1.txt | cut -c1-250
}
probe() { # tag args...
  local tag=$1; shift
  timeout 90 bash .gpu/with-python python3 benches/probes/d2h_rounds_why.py "$@" > $OUT/why_$tag.txt 2>&1; echo "d2h_rounds_why $tag rc=$?"
  cat $OUT/why_$tag.txt | cut -c1-400
}
if [ $PART = 1 ]; then
  # Part 1 (session 46's final bench, 1c42c30/9c77d0c, on the GPU for the first time):
  # the Python suite, `pinlane.bench --quick`, spdl_compare x3 (E, F, G), and the probe
  # benches/probes/d2h_rounds_why.py without and with the peers imported.
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
  probe plain
  probe peers --peers
  for t in E F G; do compare $t; done
  timeout 90 bash .gpu/with-python python3 -m pinlane.bench --quick > $OUT/pinlane_bench_quick.txt 2>&1; echo "pinlane.bench --quick rc=$?"
  tail -16 $OUT/pinlane_bench_quick.txt
fi
# Part 2 (at most 8 files come back: each probe's output is one file): the rounds probe
# with the outputs' drop timed apart, without and with the `.cpu()` way, and the
# 1000 x 1 KiB probe benches/probes/many_cold.py, twice each.
if [ $PART = 2 ]; then
  probe nocpu --no-cpu
  probe cpu
  for i in 1 2; do
    timeout 120 bash .gpu/with-python python3 benches/probes/many_cold.py > $OUT/many_cold_$i.txt 2>&1; echo "many_cold $i rc=$?"
    cat $OUT/many_cold_$i.txt
  done
  probe nocpu2 --no-cpu
fi
# Part 3 (the outputs handed to torch while the copies run: the engine's
# transfer_tensor_d2h_overlapping and Tensor::to_dlpack_in_flight, the binding's D2H):
# every test binary (.gpu/run-tests), the Python suite, benches/probes/d2h_handover.py
# with the package before (.gpu/alt, session 46's wheel) and after, in turn x3, then
# compute-sanitizer memcheck on gpu_semantics and gpu_roundtrip and initcheck on
# gpu_roundtrip.
if [ $PART = 3 ]; then
  bash .gpu/run-tests > $OUT/rust.log 2>&1
  echo "tests rc=$? $(tail -1 $OUT/rust.log)"
  grep -E "FAILED|panicked" $OUT/rust.log | head -5
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/alt/*.whl
  for i in 1 2 3; do
    for v in old site; do
      PYTHONPATH=/tmp/$v timeout 60 python3 benches/probes/d2h_handover.py $v$i >> $OUT/handover.txt 2>&1; echo "handover $v$i rc=$?"
    done
  done
  grep -v "pinlane from" $OUT/handover.txt | sort -k2 -s | cut -c1-300
  for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" "gpu_roundtrip initcheck"; do
    set -- $t; b=$1; shift; tool=$1
    log=$OUT/san_${b}_$tool.log
    PINLANE_REQUIRE_GPU=1 timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool "$@" .gpu/tests/test-$b > $log 2>&1
    echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' $log | tail -1) $(grep -E '^test result' $log | tail -1 | cut -c1-60)"
  done
fi
# Part 4 (part 3's code): spdl_compare x3 (H, I, J) and benches/py_overhead.py.
if [ $PART = 4 ]; then
  for t in H I J; do compare $t; done
  timeout 120 bash .gpu/with-python python3 benches/py_overhead.py > $OUT/py_overhead.txt 2>&1; echo "py_overhead rc=$?"
  grep -E "^1 KiB|^64 images|transfer_tensor_d2h|d.cpu" $OUT/py_overhead.txt
fi
# Part 5 (1589b43: the handover for batches of 1 MiB or more only): the Python suite,
# d2h_handover.py with 9c77d0c's wheel (.gpu/alt) and 1589b43's in turn x3,
# spdl_compare x3 (K, L, M).
if [ $PART = 5 ]; then
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/alt/*.whl
  for i in 1 2 3; do
    for v in old site; do
      PYTHONPATH=/tmp/$v timeout 60 python3 benches/probes/d2h_handover.py $v$i >> $OUT/handover.txt 2>&1; echo "handover $v$i rc=$?"
    done
  done
  grep -v "pinlane from" $OUT/handover.txt | sort -k2 -s | cut -c1-300
  for t in K L M; do compare $t; done
  # At most 8 files come back: the three tables in one file.
  for t in K L M; do echo "=== spdl_compare $t"; cat $OUT/py_compare_$t.txt; rm $OUT/py_compare_$t.txt; done > $OUT/py_compare_KLM.txt
fi
# Part 6 (1589b43's Rust bench): the rows of one and of 1000 tensors of 1 KiB in three
# processes, and the 8 x 32 MiB rows once.
if [ $PART = 6 ]; then
  for i in 1 2 3; do
    timeout 60 .gpu/bin/bench-transfer --only "1 KiB f32" > $OUT/bench_small_$i.txt 2>&1; echo "bench small $i rc=$?"
    grep -E "KiB" $OUT/bench_small_$i.txt | cut -c1-110
  done
  timeout 100 .gpu/bin/bench-transfer --only "8 x 32 MiB" > $OUT/bench_8x32.txt 2>&1; echo "bench 8x32 rc=$?"
  grep -E "MiB|limit" $OUT/bench_8x32.txt | cut -c1-110
fi
# Part 7 (the final code): every test binary.
if [ $PART = 7 ]; then
  bash .gpu/run-tests > $OUT/rust.log 2>&1
  echo "tests rc=$? $(tail -1 $OUT/rust.log)"
  grep -E "FAILED|panicked" $OUT/rust.log | head -5
fi
# Part 8 (the final code): benches/probes/gil_contention.py with 9c77d0c's wheel and the
# final one in turn x2 (D2H while a pure-Python thread keeps the interpreter busy).
if [ $PART = 8 ]; then
  bash .gpu/with-python true
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/alt/*.whl
  for i in 1 2; do
    for v in old site; do
      PYTHONPATH=/tmp/$v timeout 45 python3 benches/probes/gil_contention.py $v$i >> $OUT/gil.txt 2>&1; echo "gil $v$i rc=$?"
    done
  done
  cat $OUT/gil.txt | grep -v "^$"
fi
