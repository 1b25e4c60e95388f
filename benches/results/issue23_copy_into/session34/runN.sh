#!/bin/bash
# Run N (session 34), at 8ba4dde (engine as 5ad2eb3, package as ae7dbad): issue 23's
# serving-step bench x2 and the Rust serving step example x2, traced.
cd "$(dirname "$0")/.."
FINAL=$OUT; OUT=/tmp/rn; mkdir -p $OUT
trap 'tar czf $FINAL/runN.tar.gz -C /tmp rn' EXIT
for i in 1 2; do
  timeout 150 bash .gpu/with-python python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_N$i.json > $OUT/copy_into_N$i.txt 2>&1; echo "copy_into N$i rc=$? $(grep -c terminate $OUT/copy_into_N$i.txt) terminate lines"; grep -E "^\| [0-9]" $OUT/copy_into_N$i.txt
done
for i in 1 2; do
  timeout 60 .gpu/bin/serving_step 2000 --trace > $OUT/serving_step_N$i.txt 2>&1; echo "serving_step N$i rc=$?"; head -3 $OUT/serving_step_N$i.txt | cut -c1-250
done
