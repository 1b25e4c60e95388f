#!/bin/bash
# Run D (session 37): run C's Rust bench had 8 x 32 MiB H2D from pageable memory at 0.744
# of the limit in one new process (0.889 in the other, 0.910 and 0.860 old). The rows of
# 8 x 32 MiB and 1000 x 1 KiB only (--only), old (5412652) and new (1b706f2) in turn, five
# processes each.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rd; mkdir -p $OUT
trap 'tar czf $FINAL/runD.tar.gz -C /tmp rd' EXIT
for i in 1 2 3 4 5; do
  for v in old new; do
    if [ $v = old ]; then b=.gpu/ab/bench-transfer-old; else b=.gpu/bin/bench-transfer; fi
    for only in "8 x 32 MiB" "1000 x 1 KiB"; do
      tag=${v}${i}_$(echo $only | tr -d ' ')
      timeout 100 $b --only "$only" --json $OUT/bench_$tag.json > $OUT/bench_$tag.txt 2>&1; echo "$tag rc=$?"
      grep -E "H2D pageable|pinned limit" $OUT/bench_$tag.txt | cut -c1-110
    done
  done
done
