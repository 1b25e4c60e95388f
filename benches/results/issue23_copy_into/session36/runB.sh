#!/bin/bash
# Run B (session 36), at ef83752, right after run A on the same machine: issue 23's
# serving-step bench x2 (Buffers and Pairs beside torch), py_overhead's serving step, the
# Rust serving step; then the Rust bench old (0ac3204's build) and new in turn (the D2H
# rows the gate touches): the 1 KiB rows x2, the images x1.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rb; mkdir -p $OUT
trap 'tar czf $FINAL/runB.tar.gz -C /tmp rb' EXIT
bash .gpu/with-python true
for i in 1 2; do
  PYTHONUNBUFFERED=1 timeout 150 bash .gpu/with-python python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_B$i.json > $OUT/copy_into_B$i.txt 2>&1; echo "copy_into B$i rc=$? $(grep -c terminate $OUT/copy_into_B$i.txt) terminate lines"; grep -E "^\| [0-9]" $OUT/copy_into_B$i.txt | cut -c1-200
done
PYTHONUNBUFFERED=1 timeout 110 bash .gpu/with-python python3 benches/py_overhead.py > $OUT/py_overhead_B.log 2>&1; echo "py_overhead rc=$?"
grep -A14 "16-tensor serving step" $OUT/py_overhead_B.log
timeout 60 .gpu/bin/serving_step 2000 --trace > $OUT/serving_step_B.txt 2>&1; echo "serving_step rc=$?"; head -3 $OUT/serving_step_B.txt | cut -c1-250
run() { # version row tag
  b=.gpu/bin/bench-transfer; [ $1 = old ] && b=.gpu/bench-transfer-old
  timeout 100 $b --only "$2" --json $OUT/bench_${2// /}_$1_$3.json > $OUT/bench_${2// /}_$1_$3.txt 2>&1
  echo "$1 $2 $3 rc=$?"; grep -E "^(1 x 1|1000 x|64 x 3)" $OUT/bench_${2// /}_$1_$3.txt | grep -E "d2h|D2H|pinned out|pageable out" | cut -c1-110
}
for i in 1 2; do for v in old new; do run $v "1 KiB" B$i; done; done
for v in new old; do run $v "224" B1; done
