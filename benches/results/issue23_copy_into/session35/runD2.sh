#!/bin/bash
# Run D2 (session 35), right after D1 on the same machine: copies into existing tensors,
# old (6c64b0d: the last step released before leasing) and new (92963d5: after queueing)
# in turn: issue 23's serving-step bench x2 each, the Rust serving step x2 each (traced),
# and py_overhead's serving step.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rd2; mkdir -p $OUT
trap 'tar czf $FINAL/runD2.tar.gz -C /tmp rd2' EXIT
bash .gpu/with-python true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oldsite .gpu/oldwheel/*.whl; echo "old wheel rc=$?"
for i in 1 2; do
  for v in new old; do
    if [ $v = old ]; then P=/tmp/oldsite:/tmp/site; b=.gpu/oldwheel/serving_step; else P=/tmp/site; b=.gpu/bin/serving_step; fi
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 150 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}_D$i.json > $OUT/copy_into_${v}_D$i.txt 2>&1; echo "copy_into $v D$i rc=$? $(grep -c terminate $OUT/copy_into_${v}_D$i.txt) terminate lines"; grep -E "^\| [0-9]" $OUT/copy_into_${v}_D$i.txt | cut -c1-160
    timeout 60 $b 2000 --trace > $OUT/serving_step_${v}_D$i.txt 2>&1; echo "serving_step $v D$i rc=$?"; head -3 $OUT/serving_step_${v}_D$i.txt | cut -c1-250
  done
done
for v in new old; do
  if [ $v = old ]; then P=/tmp/oldsite:/tmp/site; else P=/tmp/site; fi
  PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 110 python3 benches/py_overhead.py > $OUT/py_overhead_${v}_D.log 2>&1; echo "py_overhead $v rc=$?"
  grep -A10 "16-tensor serving step" $OUT/py_overhead_${v}_D.log
done
