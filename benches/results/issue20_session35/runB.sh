#!/bin/bash
# Run B (session 35): the copy threads' pieces (several per thread), old (b489313) and
# new in turn: the 1 KiB rows x3 traced, the images x2 and the 32 MiB rows once each.
cd "$(dirname "$0")/../../.."
FINAL=$OUT; OUT=/tmp/rb; mkdir -p $OUT
trap 'tar czf $FINAL/runB.tar.gz -C /tmp rb' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
run() { # version row tag [--trace]
  b=.gpu/bin/bench-transfer; [ $1 = old ] && b=.gpu/bench-transfer-old
  timeout 100 $b --only "$2" $4 --json $OUT/bench_${2// /}_$1_$3.json > $OUT/bench_${2// /}_$1_$3.txt 2>&1
  echo "$1 $2 $3 rc=$?"; grep -E "^(1000 x|64 x 3|8 x 32)|^trace 1000.*h2d \(median" $OUT/bench_${2// /}_$1_$3.txt | cut -c1-200
}
for i in 1 2 3; do for v in old new; do run $v "1 KiB" B$i --trace; done; done
for i in 1 2; do for v in new old; do run $v "224" B$i; done; done
for v in old new; do run $v "32 MiB" B1; done
