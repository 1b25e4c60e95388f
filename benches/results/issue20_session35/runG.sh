#!/bin/bash
# Run G (session 35), at 4343cba (staging windows ramp from half a MiB): the Rust bench,
# old (d71dc15) and new in turn: the 1 KiB rows x3 traced, the images x2, 32 MiB once;
# then both Rust suites and the Python suite.
cd "$(dirname "$0")/../../.."
FINAL=$OUT; OUT=/tmp/rg; mkdir -p $OUT
trap 'tar czf $FINAL/runG.tar.gz -C /tmp rg' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
run() { # version row tag [--trace]
  b=.gpu/bin/bench-transfer; [ $1 = old ] && b=.gpu/bench-transfer-old
  timeout 100 $b --only "$2" $4 --json $OUT/bench_${2// /}_$1_$3.json > $OUT/bench_${2// /}_$1_$3.txt 2>&1
  echo "$1 $2 $3 rc=$?"; grep -E "^(1000 x|64 x 3|8 x 32)" $OUT/bench_${2// /}_$1_$3.txt | grep -E "H2D pageable" | cut -c1-100; grep -E "^trace 1000.*h2d" $OUT/bench_${2// /}_$1_$3.txt | grep -E "median us|whole" | cut -c60-260
}
for i in 1 2 3; do for v in old new; do run $v "1 KiB" G$i --trace; done; done
for i in 1 2; do for v in new old; do run $v "224" G$i; done; done
for v in old new; do run $v "32 MiB" G1; done
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED" $OUT/py.log | head -5)
