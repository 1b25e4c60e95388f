#!/bin/bash
# Run C (session 36), same machine after run B: the Rust bench's 1 KiB rows, old
# (0ac3204's build) and new (ef83752) in turn, three more pairs each order, traced (run
# B's first pair differed by 22 us on the 1000 x 1 KiB D2H into page-locked outputs).
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rc; mkdir -p $OUT
trap 'tar czf $FINAL/runC.tar.gz -C /tmp rc' EXIT
run() { # version row tag
  b=.gpu/bin/bench-transfer; [ $1 = old ] && b=.gpu/bench-transfer-old
  timeout 100 $b --only "$2" --trace --json $OUT/bench_${2// /}_$1_$3.json > $OUT/bench_${2// /}_$1_$3.txt 2>&1
  echo "$1 $2 $3 rc=$?"; grep -E "^(1 x 1|1000 x)" $OUT/bench_${2// /}_$1_$3.txt | grep -E "D2H pinned" | cut -c1-110; grep -E "^trace 1000.*d2h \(median" $OUT/bench_${2// /}_$1_$3.txt | cut -c60-200
}
for i in 1 2 3; do for v in new old; do run $v "1 KiB" C$i; done; for v in old new; do run $v "1 KiB" C$i-r; done; done
