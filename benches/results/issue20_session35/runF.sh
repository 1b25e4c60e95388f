#!/bin/bash
# Run F (session 35), at d71dc15 (copies prefetch the next task's source): both Rust
# suites, the Python suite, memcheck on gpu_roundtrip and gpu_into; then the Rust bench
# old (40245cf) and new in turn: the 1 KiB rows x3 traced, the images x2, 32 MiB once.
cd "$(dirname "$0")/../../.."
FINAL=$OUT; OUT=/tmp/rf; mkdir -p $OUT
trap 'tar czf $FINAL/runF.tar.gz -C /tmp rf' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED" $OUT/py.log | head -5)
for t in "gpu_roundtrip memcheck --leak-check full" "gpu_into memcheck --leak-check full"; do
  set -- $t; b=$1; shift; tool=$1
  f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
  PINLANE_REQUIRE_GPU=1 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool "$@" .gpu/shipped/$f > $OUT/san_${b}_$tool.log 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_${b}_$tool.log | tail -1) $(grep -E '^test result' $OUT/san_${b}_$tool.log | tail -1 | cut -c1-40)"
done
run() { # version row tag [--trace]
  b=.gpu/bin/bench-transfer; [ $1 = old ] && b=.gpu/bench-transfer-old
  timeout 100 $b --only "$2" $4 --json $OUT/bench_${2// /}_$1_$3.json > $OUT/bench_${2// /}_$1_$3.txt 2>&1
  echo "$1 $2 $3 rc=$?"; grep -E "^(1000 x|64 x 3|8 x 32)" $OUT/bench_${2// /}_$1_$3.txt | grep -E "pageable|pinned out" | cut -c1-100; grep -E "^trace 1000.*h2d \(median" $OUT/bench_${2// /}_$1_$3.txt | cut -c80-260
}
for i in 1 2 3; do for v in old new; do run $v "1 KiB" F$i --trace; done; done
for i in 1 2; do for v in new old; do run $v "224" F$i; done; done
for v in old new; do run $v "32 MiB" F1; done
