#!/bin/bash
# Run C (session 37), at 1b706f2 (the caller spins for its copy job's last pieces; copies
# into existing tensors wake the copy threads at entry). Part 1: both Rust GPU suites,
# the Python suite, compute-sanitizer memcheck (gpu_semantics, gpu_roundtrip, gpu_into),
# initcheck (gpu_roundtrip), synccheck (gpu_into); the Rust bench, old (5412652, the code
# of 1d51b40: .gpu/ab/bench-transfer-old) and new in turn. Part 2: the peers comparison
# (benches/spdl_compare.py, with the new bench's JSON), and the Rust bench old and new
# in turn once more.
cd "$(dirname "$0")/../../../.."
PART=${1:-1}
FINAL=$OUT; OUT=/tmp/rc$PART; mkdir -p $OUT
trap 'tar czf $FINAL/runC$PART.tar.gz -C /tmp rc$PART' EXIT
bench() { # tag binary
  timeout 150 $2 --json $OUT/bench_$1.json > $OUT/bench_$1.txt 2>&1; echo "bench $1 rc=$?"
  grep -E "^\| [0-9]" $OUT/bench_$1.txt | cut -c1-150
}
if [ $PART = 1 ]; then
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log; grep -E "FAILED|panicked" $OUT/rust.log | head -5)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED|Error" $OUT/py.log | head -8)
for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
  PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool "$@" .gpu/shipped/$f > $OUT/san_${b}_$tool.log 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_${b}_$tool.log | tail -1) $(grep -E '^test result' $OUT/san_${b}_$tool.log | tail -1 | cut -c1-40)"
done
bench old1 .gpu/ab/bench-transfer-old
bench new1 .gpu/bin/bench-transfer
else
bash .gpu/with-python true
R=""; [ -f /tmp/rc1/bench_new1.json ] && R="--rust /tmp/rc1/bench_new1.json"  # part 1's, same machine
timeout 220 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_C.json $R > $OUT/py_compare_C.txt 2>&1; echo "spdl_compare rc=$?"; grep -E "^\| [0-9o]|limit" $OUT/py_compare_C.txt | cut -c1-250
bench old2 .gpu/ab/bench-transfer-old
bench new2 .gpu/bin/bench-transfer
fi
