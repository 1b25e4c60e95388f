#!/usr/bin/env bash
# Session 56, run 2 (one H200): the small rows, old (0af6756, session 55's final code, in
# .gpu/old) and new in turn, three pairs: the Rust bench's 1 KiB rows (one tensor and
# 1000) and benches/probes/one_small_ab.py (small calls from Python against torch's own);
# then one traced Rust run of each build.
cd "$(dirname "$0")/../../.."
o=$OUT/run2.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $o
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "$2"; }
pipi /tmp/old .gpu/old/pywheels/*.whl; pipi /tmp/site .gpu/pywheels/*.whl
for p in 1 2 3; do
  for v in old new; do
    if [ $v = old ]; then b=.gpu/old/bench-transfer; pp=/tmp/old; else b=.gpu/bin/bench-transfer; pp=/tmp/site; fi
    echo "== $v$p bench-transfer --only '1 KiB'" >> $o
    timeout 60 $b --only "1 KiB" >> $o 2>&1
    echo "== $v$p one_small_ab" >> $o
    PYTHONPATH=$pp PYTHONUNBUFFERED=1 timeout 100 python3 benches/probes/one_small_ab.py $v$p >> $o 2>&1
  done
done
for v in old new; do
  if [ $v = old ]; then b=.gpu/old/bench-transfer; else b=.gpu/bin/bench-transfer; fi
  echo "== $v bench-transfer --trace --only '1 KiB'" >> $o
  timeout 60 $b --trace --only "1 KiB" >> $o 2>&1
done
grep -E "^==|1 KiB f32 +(H2D pageable|D2H pinned)|one 1 KiB|dict of 2" $o | cut -c1-200
