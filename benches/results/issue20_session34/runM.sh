#!/bin/bash
# Run M (session 34), after ae7dbad (one plain tensor in one native call): part 1, the
# Python suite with torch; pinlane.bench's one 1 KiB tensor, every way, new and old
# (3fd2f02) packages in turn x3. Part 2: py_overhead new and old; the peers comparison.
cd "$(dirname "$0")/.."
PART=${1:-1}
FINAL=$OUT; OUT=/tmp/rm$PART; mkdir -p $OUT
trap 'tar czf $FINAL/runM$PART.tar.gz -C /tmp rm$PART' EXIT
bash .gpu/with-python true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oldsite .gpu/oldwheel/*.whl; echo "old wheel rc=$?"
if [ $PART = 1 ]; then
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED" $OUT/py.log | head -5)
for i in 1 2 3; do
  for v in new old; do
    if [ $v = old ]; then P=/tmp/oldsite:/tmp/site; else P=/tmp/site; fi
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 60 python3 -m pinlane.bench --batch 1x256:float32 > $OUT/one_${v}_M$i.txt 2>&1; echo "bench one $v M$i rc=$?"; grep -E "^\||limit" $OUT/one_${v}_M$i.txt | cut -c1-200
  done
done
else
for v in new old; do
  if [ $v = old ]; then P=/tmp/oldsite:/tmp/site; else P=/tmp/site; fi
  PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 110 python3 benches/py_overhead.py > $OUT/py_overhead_${v}_M.log 2>&1; echo "py_overhead $v rc=$?"
  grep -E "^(pinlane.transfer|torch: t.to|torch: d.cpu|1 KiB)" $OUT/py_overhead_${v}_M.log | cut -c1-100
done
timeout 200 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_M.json > $OUT/py_compare_M.txt 2>&1; echo "spdl_compare M rc=$?"; grep -E "^\| [0-9o]|limit" $OUT/py_compare_M.txt | cut -c1-250
fi
