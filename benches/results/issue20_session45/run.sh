#!/bin/bash
# Session 45, issue 20. Parts 1 and 2: the code of a7de7d0 (the end flags after the final
# read-through) checked on the H200. Part 5: where 1000 x 1 KiB pageable H2D's time goes.
# Parts 6 to 11: window fill jobs and the late allocation (the commit after a7de7d0):
# checked, against a7de7d0 (part 11: the 8 x 32 MiB rows), the prefetch distance tried,
# and the peers comparison x3.
# Part 1: every GPU test binary (.gpu/run-tests) and the Python suite with torch.
# Part 2: the shipped test binaries and compute-sanitizer (as benches/gpu_verify.sh).
# (Parts 3 and 4, planned here first, were not run: parts 7 to 10 replaced them.)
# The .gpu folder is carried in parts (the carry limit): parts 1 and 6 with .gpu/tests and
# .gpu/pywheels; part 2 with .gpu/shipped; the others with .gpu/bin, .gpu/ab, .gpu/whl and
# .gpu/pywheels.
cd "$(dirname "$0")/../../.."
PART=${1:-1}
FINAL=$OUT; OUT=/tmp/r$PART; mkdir -p $OUT
trap 'tar czf $FINAL/run$PART.tar.gz -C /tmp r$PART' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
compare() { # tag
  timeout 240 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$1.json $R > $OUT/py_compare_$1.txt 2>&1; echo "spdl_compare $1 rc=$?"
  grep -E "^\| [0-9o]|limit" $OUT/py_compare_$1.txt | cut -c1-250
}
if [ $PART = 1 ] || [ $PART = 6 ]; then
  bash .gpu/run-tests > $OUT/rust.log 2>&1
  echo "tests rc=$? $(tail -1 $OUT/rust.log)"
  grep -E "FAILED|panicked" $OUT/rust.log | head -5
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
elif [ $PART = 2 ]; then
  bash .gpu/run-shipped > $OUT/shipped.log 2>&1
  echo "shipped rc=$? $(tail -1 $OUT/shipped.log)"
  for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" \
           "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
    set -- $t; b=$1; shift; tool=$1
    f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
    log="$OUT/san_${b}_$tool.log"
    PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$f" > "$log" 2>&1
    echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-40)"
  done
fi
# (appended) Part 5: why 1000 x 1 KiB pageable H2D takes 83 to 95 us: its row traced
# with the copy threads' idle spin (PINLANE_SPIN_US) at 50 (the default), 300 and 2000 us,
# and with 4 and 8 copy threads, in turn, three rounds.
if [ $PART = 5 ]; then
  for i in 1 2 3; do
    for v in s50 s300 s2000 t4 t8; do
      case $v in s*) export PINLANE_SPIN_US=${v#s}; unset PINLANE_COPY_THREADS;; t*) export PINLANE_SPIN_US=50 PINLANE_COPY_THREADS=${v#t};; esac
      timeout 60 .gpu/bin/bench-transfer --only "1000 x 1 KiB" --trace --json $OUT/bench_$v-$i.json > $OUT/bench_$v-$i.txt 2>&1; echo "bench $v-$i rc=$?"
      grep -E "H2D pageable|^trace 1000 x 1 KiB f32 h2d \(" $OUT/bench_$v-$i.txt | cut -c1-260
    done
  done
fi
# Part 6 (after the window fill jobs and the late allocation, uncommitted tree on top of
# a7de7d0): part 1's checks (run by part 1's branch above). Part 7: the Rust bench's 1000 x 1 KiB rows traced, old
# (a7de7d0: .gpu/ab/bench-transfer-old) and new in turn x3; then the whole bench old and
# new once each. Part 8: spdl_compare twice with part 7's new bench JSON; part 10 once
# more.
if [ $PART = 7 ]; then
  for i in 1 2 3; do
    for v in old new; do
      b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/ab/bench-transfer-old
      timeout 60 $b --only "1000 x 1 KiB" --trace --json $OUT/bench_$v$i.json > $OUT/bench_$v$i.txt 2>&1; echo "bench $v$i rc=$?"
      grep -E "H2D pageable|^trace 1000 x 1 KiB f32 h2d \(" $OUT/bench_$v$i.txt | cut -c1-260
    done
  done
  for v in old new; do
    b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/ab/bench-transfer-old
    timeout 200 $b --json $OUT/bench_${v}_all.json > $OUT/bench_${v}_all.txt 2>&1; echo "bench ${v}_all rc=$?"
    grep -E "^[0-9].*(H2D|D2H)" $OUT/bench_${v}_all.txt | cut -c1-100
  done
elif [ $PART = 8 ]; then
  bash .gpu/with-python true
  R="--rust benches/results/issue20_session45/part7/bench_new_all.json"
  compare A
  compare B
fi
if [ $PART = 10 ]; then
  bash .gpu/with-python true
  R="--rust benches/results/issue20_session45/part7/bench_new_all.json"
  compare C
fi
# Part 9: the window fill's prefetch distance: the new bench built with the next 1, 4
# or 8 sources' first KiB asked for ahead of each copy (.gpu/ab/bench-ahead{1,4,8}; 1 is
# part 7's new code), the 1000 x 1 KiB rows traced and the images' rows, in turn x3.
if [ $PART = 9 ]; then
  for i in 1 2 3; do
    for a in 1 4 8; do
      b=.gpu/ab/bench-ahead$a
      timeout 60 $b --only "1000 x 1 KiB" --trace --json $OUT/bench_a$a-$i.json > $OUT/bench_a$a-$i.txt 2>&1; echo "bench a$a-$i rc=$?"
      grep -E "H2D pageable|^trace 1000 x 1 KiB f32 h2d \(" $OUT/bench_a$a-$i.txt | cut -c1-260
      timeout 60 $b --only "64 x 3x224x224" --json $OUT/bench_img_a$a-$i.json > $OUT/bench_img_a$a-$i.txt 2>&1; echo "bench img a$a-$i rc=$?"
      grep -E "H2D pageable" $OUT/bench_img_a$a-$i.txt | cut -c1-100
    done
  done
fi
# Part 11: the 8 x 32 MiB rows (part 7 had 0.927 old against 0.884 new for its pageable
# H2D in one pair), a7de7d0 (old) and baa3fa1 (new) in turn x3.
if [ $PART = 11 ]; then
  for i in 1 2 3; do
    for v in old new; do
      b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/ab/bench-transfer-old
      timeout 100 $b --only "8 x 32 MiB" --json $OUT/bench_$v$i.json > $OUT/bench_$v$i.txt 2>&1; echo "bench $v$i rc=$?"
      grep -E "H2D pageable|H2D pinned " $OUT/bench_$v$i.txt | cut -c1-100
    done
  done
fi
