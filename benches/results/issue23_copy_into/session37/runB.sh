#!/bin/bash
# Run B (session 37): the probe small_fill.cu (second version: workers that spin 50 us
# and then sleep, as CopyPool's, woken some microseconds ahead of the job or not; three
# ways for the device to take the staged bytes), then benches/copy_into.py with the
# wheel of 5412652 (old: the code of 1d51b40) and with the working tree's (new: the
# caller spins for its fill's last pieces; pageable sources wake the copy threads at the
# call's entry), in turn, three processes each, defaults.
# Wheels: .gpu/ab/{old,new}/ (python3 -m pip wheel --no-deps ./python on the build machine).
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rb; mkdir -p $OUT
trap 'tar czf $FINAL/runB.tar.gz -C /tmp rb' EXIT
nvcc -O3 -Xcompiler -march=native -o /tmp/small_fill benches/probes/small_fill.cu && /tmp/small_fill > $OUT/small_fill_B.txt 2>&1
echo "probe rc=$?"
for v in old new; do
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_$v .gpu/ab/$v/*.whl || exit 1
done
for i in 1 2 3; do
  for v in old new; do
    PYTHONPATH=/tmp/site_$v PYTHONUNBUFFERED=1 timeout 150 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"; grep -E "^\| [0-9]" $OUT/copy_into_${v}$i.txt | cut -c1-200
    grep -E "Pairs.copy's call" $OUT/copy_into_${v}$i.txt | grep pageable | cut -c1-50,90-400
  done
done
