#!/bin/bash
# Session 46, issue 20. Run on the H200 from the repository root with $OUT set.
# Part 1: smaller staging windows for small staged regions. The Rust bench built three
# ways (.gpu/ab/bench-w1m: windows of at least 1 MiB, the buffer allocated after the fill
# starts for one window, as at dc862ae; bench-w512: 512 KiB, lazily for up to 2 windows;
# bench-w256: 256 KiB, up to 4), in turn x3: the 1000 x 1 KiB rows traced, the images'
# rows. Then the 8 x 32 MiB rows once (w1m), and benches/probes/d2h_link.py twice.
cd "$(dirname "$0")/../../.."
PART=${1:-1}
FINAL=$OUT; OUT=/tmp/r$PART; mkdir -p $OUT
trap 'tar czf $FINAL/run$PART.tar.gz -C /tmp r$PART' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
if [ $PART = 1 ]; then
  for i in 1 2 3; do
    for v in w1m w512 w256; do
      b=.gpu/ab/bench-$v
      timeout 60 $b --only "1000 x 1 KiB" --trace --json $OUT/bench_$v-$i.json > $OUT/bench_$v-$i.txt 2>&1; echo "bench $v-$i rc=$?"
      grep -E "H2D pageable|^trace 1000 x 1 KiB f32 h2d \(" $OUT/bench_$v-$i.txt | cut -c1-300
      timeout 60 $b --only "64 x 3x224x224" --json $OUT/bench_img_$v-$i.json > $OUT/bench_img_$v-$i.txt 2>&1; echo "bench img $v-$i rc=$?"
      grep -E "H2D pageable" $OUT/bench_img_$v-$i.txt | cut -c1-100
    done
  done
  timeout 100 .gpu/ab/bench-w1m --only "8 x 32 MiB" --json $OUT/bench_8x32.json > $OUT/bench_8x32.txt 2>&1; echo "bench 8x32 rc=$?"
  grep -E "limit|D2H" $OUT/bench_8x32.txt | cut -c1-120
  for i in 1 2; do
    timeout 120 bash .gpu/with-python python3 benches/probes/d2h_link.py > $OUT/d2h_link_$i.txt 2>&1; echo "d2h_link $i rc=$?"
    tail -7 $OUT/d2h_link_$i.txt
  done
fi
# Part 2: the peers bench with the batches at the link timed in rounds both ways (every
# way and the limit's copy in turn, call by call; the code of this part only, changed
# after it): the Python suite with the new wheel, the package's `python -m pinlane.bench
# --quick`, the Rust bench whole (for the Rust column), and benches/spdl_compare.py once
# (A).
# Part 3 (the bench's final form: D2H of the batches at the link in rounds, with the
# floor row; H2D way by way): the Python suite, `pinlane.bench --quick`, the Rust bench
# whole, spdl_compare once (B), benches/probes/few_small.py, benches/probes/small_floor.cu
# and benches/py_overhead.py. Part 4 (spdl_compare C and D) never ran as such: parts 5
# and 6 ran C and D.
compare() { # tag
  timeout 280 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$1.json $R > $OUT/py_compare_$1.txt 2>&1; echo "spdl_compare $1 rc=$?"
  grep -E "^\| [0-9o]|limit" $OUT/py_compare_$1.txt | cut -c1-250
}
if [ $PART = 2 ] || [ $PART = 3 ]; then
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
  timeout 120 bash .gpu/with-python python3 -m pinlane.bench --quick > $OUT/pinlane_bench_quick.txt 2>&1; echo "pinlane.bench --quick rc=$?"
  tail -14 $OUT/pinlane_bench_quick.txt
  timeout 200 .gpu/bin/bench-transfer --json $OUT/bench_all.json > $OUT/bench_all.txt 2>&1; echo "bench all rc=$?"
  grep -E "^[0-9].*(H2D|D2H)" $OUT/bench_all.txt | cut -c1-100
  R="--rust $OUT/bench_all.json"
  [ $PART = 2 ] && compare A
  if [ $PART = 3 ]; then
    compare B
    timeout 60 bash .gpu/with-python python3 benches/probes/few_small.py > $OUT/few_small.txt 2>&1; echo "few_small rc=$?"; cat $OUT/few_small.txt
    nvcc -O3 -arch=sm_90 -o /tmp/small_floor benches/probes/small_floor.cu -lcuda && timeout 60 /tmp/small_floor 1024 > $OUT/small_floor.txt 2>&1; echo "small_floor rc=$?"; cat $OUT/small_floor.txt
    timeout 120 bash .gpu/with-python python3 benches/py_overhead.py > $OUT/py_overhead.txt 2>&1; echo "py_overhead rc=$?"
  fi
elif [ $PART = 4 ]; then
  bash .gpu/with-python true
  R="--rust benches/results/issue20_session46/part3/bench_all.json"
  compare C
  compare D
fi
# Part 5: why the ways that hand out new outputs lose 3% at 8 x 32 MiB D2H where the bare
# copies do not: benches/probes/d2h_dest.py with the package as at part 3 and with a wheel
# whose D2H pool hands out the block given back last (.gpu/alt, the working tree's
# src/memory/pinned.rs then); spdl_compare once with each (C: part 3's package; L: the
# other wheel).
if [ $PART = 5 ]; then
  bash .gpu/with-python true
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_lifo .gpu/alt/*.whl .gpu/whl/*.whl || exit 1
  timeout 90 bash .gpu/with-python python3 benches/probes/d2h_dest.py > $OUT/d2h_dest_part3pkg.txt 2>&1; echo "d2h_dest part3 package rc=$?"; cat $OUT/d2h_dest_part3pkg.txt
  PYTHONPATH=/tmp/site_lifo PYTHONUNBUFFERED=1 timeout 90 python3 benches/probes/d2h_dest.py > $OUT/d2h_dest_lifo.txt 2>&1; echo "d2h_dest lifo rc=$?"; cat $OUT/d2h_dest_lifo.txt
  R="--rust benches/results/issue20_session46/part3/bench_all.json"
  compare C
  PYTHONPATH=/tmp/site_lifo PYTHONUNBUFFERED=1 timeout 280 python3 benches/spdl_compare.py --json $OUT/py_compare_L.json $R > $OUT/py_compare_L.txt 2>&1; echo "spdl_compare L rc=$?"
  grep -E "^\| [0-9o]|limit" $OUT/py_compare_L.txt | cut -c1-250
fi
# Part 6: spdl_compare a third time with part 3's package (D), then the Rust bench's
# 1000 x 1 KiB rows traced x3.
if [ $PART = 6 ]; then
  bash .gpu/with-python true
  R="--rust benches/results/issue20_session46/part3/bench_all.json"
  compare D
  for i in 1 2 3; do
    timeout 60 .gpu/bin/bench-transfer --only "1000 x 1 KiB" --trace --json $OUT/bench_small$i.json > $OUT/bench_small$i.txt 2>&1; echo "bench small$i rc=$?"
    grep -E "^1000|^trace 1000 x 1 KiB f32 h2d \(" $OUT/bench_small$i.txt | cut -c1-300
  done
fi
# Part 7 (the bench after the review: each round's order shuffled, fewer calls spread over
# the rounds, every way's D2H reading one shared device copy of the sources, a way timed
# in fewer calls only where its first D2H call took over 0.1 s): the bench's Python tests
# (test_bench.py, test_integrations_gpu.py: the whole suite ran in part 3, and only the
# bench changed since), then spdl_compare three times (B2, C2, D2). Written straight into $OUT (no tar), so that a
# run cut short still brings back what it wrote.
if [ $PART = 7 ]; then
  OUT=$FINAL; trap - EXIT
  nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
  PINLANE_REQUIRE_GPU=1 timeout 60 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests/test_bench.py python/tests/test_integrations_gpu.py > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
  R="--rust benches/results/issue20_session46/part3/bench_all.json"
  for t in B2 C2 D2; do
    timeout 130 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$t.json $R > $OUT/py_compare_$t.txt 2>&1; echo "spdl_compare $t rc=$?"
    grep -E "^\| [0-9o]|limit" $OUT/py_compare_$t.txt | cut -c1-250
  done
fi
