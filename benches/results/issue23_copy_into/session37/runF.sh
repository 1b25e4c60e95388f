#!/bin/bash
# Run F (session 37), at the final code of the session (the caller's spin for every job,
# its deadline overflow-safe; the early wake of 1b706f2 taken back), after the last change
# to the engine: both Rust GPU suites, the Python suite, compute-sanitizer memcheck
# (gpu_semantics, gpu_roundtrip, gpu_into), initcheck (gpu_roundtrip), synccheck
# (gpu_into); then benches/copy_into.py with the old wheel (.gpu/ab/old: 5412652, the code
# of 1d51b40) and the final one (.gpu/pywheels) in turn, three processes each.
cd "$(dirname "$0")/../../../.."
FINAL=$OUT; OUT=/tmp/rf; mkdir -p $OUT
trap 'tar czf $FINAL/runF.tar.gz -C /tmp rf' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
(bash .gpu/run-shipped > $OUT/shipped.log 2>&1; echo "shipped rc=$?"; tail -1 $OUT/shipped.log)
(bash .gpu/run-tests > $OUT/rust.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/rust.log; grep -E "FAILED|panicked" $OUT/rust.log | head -5)
(PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/py.log; grep -E "FAILED|Error" $OUT/py.log | head -8)
for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
  PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool "$@" .gpu/shipped/$f > $OUT/san_${b}_$tool.log 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_${b}_$tool.log | tail -1) $(grep -E '^test result' $OUT/san_${b}_$tool.log | tail -1 | cut -c1-40)"
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_old .gpu/ab/old/*.whl || exit 1
for i in 1 2 3; do
  for v in old new; do
    P=/tmp/site; [ $v = old ] && P=/tmp/site_old
    PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 150 python3 benches/copy_into.py --reps 300 --json $OUT/copy_into_${v}$i.json > $OUT/copy_into_${v}$i.txt 2>&1
    echo "$v$i rc=$?"; grep -E "^\| [0-9]" $OUT/copy_into_${v}$i.txt | cut -c1-200
  done
done
