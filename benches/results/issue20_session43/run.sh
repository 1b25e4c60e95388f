#!/bin/bash
# Session 43, issue 20: the peers comparison and the Rust bench at d5f1d31 (the code of
# c1dde2b), after issue 23's sessions 38 to 42 changed the gather kernel (descriptors in
# the launch, larger pieces) that H2D's small page-locked tensors and D2H's gather use.
# Part 1: the Rust bench old (1b706f2, the code session 37's peers comparison ran:
# .gpu/ab/bench-transfer-old) and new in turn, then benches/spdl_compare.py with the new
# bench's JSON. Part 2: spdl_compare twice more, the Rust bench's 1 KiB rows old and new
# in turn, three processes each.
cd "$(dirname "$0")/../../.."
PART=${1:-1}
FINAL=$OUT; OUT=/tmp/r$PART; mkdir -p $OUT
trap 'tar czf $FINAL/run$PART.tar.gz -C /tmp r$PART' EXIT
bench() { # tag binary [args]
  t=$1; b=$2; shift 2
  timeout 150 $b --json $OUT/bench_$t.json "$@" > $OUT/bench_$t.txt 2>&1; echo "bench $t rc=$?"
  grep -E "^\| [0-9]" $OUT/bench_$t.txt | cut -c1-150
}
compare() { # tag
  timeout 240 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_$1.json $R > $OUT/py_compare_$1.txt 2>&1; echo "spdl_compare $1 rc=$?"
  grep -E "^\| [0-9o]|limit" $OUT/py_compare_$1.txt | cut -c1-250
}
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
bash .gpu/with-python true
if [ $PART = 1 ]; then
  bench old1 .gpu/ab/bench-transfer-old
  bench new1 .gpu/bin/bench-transfer
  R="--rust $OUT/bench_new1.json"
  compare A
else
  R=""; [ -f /tmp/r1/bench_new1.json ] && R="--rust /tmp/r1/bench_new1.json"  # part 1's, same machine
  compare B
  compare C
  for i in 2 3 4; do
    bench old$i .gpu/ab/bench-transfer-old --only "1 KiB"
    bench new$i .gpu/bin/bench-transfer --only "1 KiB"
  done
fi
