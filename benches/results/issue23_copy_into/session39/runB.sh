#!/bin/bash
# Run B (session 39), after the review fixes (c13ff47: a view of a live registration
# holds its own owner; in-place reads only within one registration, CU_POINTER_ATTRIBUTE_
# BUFFER_ID asked of the first and last byte; the registry holds a registration from
# before cuMemHostRegister until after cuMemHostUnregister) and 249d7fa (Pairs in_place
# for D2H refused) and c90fcd6 (cuPointerGetAttributes: both attributes in one call): the GPU checks (benches/gpu_verify.sh), then benches/copy_into.py with
# the old wheel (.gpu/ab/old: e9129e7) and the new one in turn, three processes each.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rb; mkdir -p $OUT
trap 'tar czf $FINAL/runB.tar.gz -C /tmp rb' EXIT
bash benches/gpu_verify.sh $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_old .gpu/ab/old/*.whl || exit 1
for i in 1 2 3; do
  for v in old new; do
    P=/tmp/site; [ $v = old ] && P=/tmp/site_old
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 100 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"; grep -E "^\| [0-9]" $OUT/copy_into_${v}$i.txt | cut -c1-230
  done
done
