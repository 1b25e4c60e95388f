#!/bin/bash
# Run D (session 39), at the final code (29ba7e8: imports overlapping a registration they
# cannot hold are pageable, the registry's generation across foreign_mapped's looks; on
# top of 9359d02, the last step released after queueing): the GPU checks
# (benches/gpu_verify.sh), then benches/copy_into.py with the old wheel (.gpu/ab/old:
# 67c00bd, the engine of c90fcd6) and the new one in turn, three processes each.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rd; mkdir -p $OUT
trap 'tar czf $FINAL/runD.tar.gz -C /tmp rd' EXIT
bash benches/gpu_verify.sh $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_old .gpu/ab/old/*.whl || exit 1
for i in 1 2 3; do
  for v in old new; do
    P=/tmp/site; [ $v = old ] && P=/tmp/site_old
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 100 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"
  done
done
