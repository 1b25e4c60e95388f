#!/bin/bash
# Run K (session 34): after 5ad2eb3 (H2D queues windows during the rebuild; per-tensor host
# work): both Rust suites, the Python suite, compute-sanitizer on gpu_roundtrip and gpu_into
# (memcheck, leak check full) and synccheck on gpu_roundtrip; the Rust bench old (3fd2f02)
# and new in turn: the 1 KiB rows x3, traced, and the large rows once each.
cd "$(dirname "$0")/.."
PART=${1:-1}
FINAL=$OUT; OUT=/tmp/rk$PART; mkdir -p $OUT
trap 'tar czf $FINAL/runK$PART.tar.gz -C /tmp rk$PART' EXIT
if [ $PART = 1 ]; then
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
for i in 1 2 3; do
  for v in old new; do
    b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/bench-transfer-old
    timeout 100 $b --only "1 KiB" --trace --json $OUT/bench_tiny_${v}_K$i.json > $OUT/bench_tiny_${v}_K$i.txt 2>&1; echo "bench-transfer $v K$i rc=$?"; grep -E "^1(000)? x 1 KiB|^trace 1000.*median us per phase" $OUT/bench_tiny_${v}_K$i.txt | cut -c1-240
  done
done
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log)
else
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED" $OUT/py.log | head -5)
for spec in "gpu_roundtrip:memcheck --leak-check full" "gpu_roundtrip:synccheck" "gpu_into:memcheck --leak-check full"; do
  b=${spec%%:*}; tool=${spec#*:}; f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
  PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool $tool .gpu/shipped/$f > $OUT/san_${b}_${tool%% *}.log 2>&1; echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_${b}_${tool%% *}.log | tail -1) $(grep -E '^test result' $OUT/san_${b}_${tool%% *}.log | tail -1 | cut -c1-40)"
done
for v in old new; do
  b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/bench-transfer-old
  for row in "32 MiB" "224"; do
    timeout 100 $b --only "$row" --json $OUT/bench_${row// /}_${v}_K.json > $OUT/bench_${row// /}_${v}_K.txt 2>&1; echo "bench-transfer $v $row rc=$?"; grep -E "^(8 x 32|64 x 3)" $OUT/bench_${row// /}_${v}_K.txt | cut -c1-120
  done
done
fi
