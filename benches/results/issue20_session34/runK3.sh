#!/bin/bash
# Run K3 (session 34): the images and 1 KiB rows, old (3fd2f02) and new in turn, x3.
cd "$(dirname "$0")/.."
FINAL=$OUT; OUT=/tmp/rk3; mkdir -p $OUT
trap 'tar czf $FINAL/runK3.tar.gz -C /tmp rk3' EXIT
for i in 1 2 3; do
  for v in new old; do
    b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/bench-transfer-old
    for row in "224" "1 KiB"; do
      timeout 100 $b --only "$row" --json $OUT/bench_${row// /}_${v}_K3$i.json > $OUT/bench_${row// /}_${v}_K3$i.txt 2>&1; echo "$v $row $i rc=$?"; grep -E "^(64 x 3|1000 x)" $OUT/bench_${row// /}_${v}_K3$i.txt | cut -c1-100
    done
  done
done
