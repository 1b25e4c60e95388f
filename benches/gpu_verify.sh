#!/bin/bash
# The GPU checks a session makes after its last change to the CUDA path, on the GPU
# machine, in parts that each fit one carry (64 MiB): logs into directory $2, five files
# at most (the device tool brings back eight). Prints each check's closing line.
#
#   tests    every test binary with PINLANE_REQUIRE_GPU=1 (.gpu/run-tests) and the Python
#            suite with torch. Carry .gpu after ../shared/gpu/pack, with .gpu/bin and
#            .gpu/whl moved aside (.gpu/tests and .gpu/pywheels are what it needs), or
#            folded (benches/gpu_fold.sh).
#   shipped  the shipped test binaries (the build users get), then compute-sanitizer:
#            memcheck with the leak check on gpu_foundations (driver API errors not
#            reported: it provokes them), gpu_semantics, gpu_roundtrip and gpu_into;
#            initcheck on gpu_roundtrip; synccheck on gpu_into. Carry .gpu after
#            `bash tests/pack-shipped`, alone.
#   all      both (needs every part of .gpu: larger than one carry unless folded by
#            benches/gpu_fold.sh, which makes the test binaries xz archives).
#   rust     `all` without the Python suite (about 110 s of all's 232 on an H100): for a
#            session whose device time is short and whose change left the Python
#            package alone. Not a substitute where the package or its wheel changed.
#
# Folded test binaries (.gpu/tests.tar.xz, .gpu/shipped.tar.xz) are unfolded first.
# Run from the project root: bash benches/gpu_verify.sh tests "$OUT"
part=${1:?usage: gpu_verify.sh tests|shipped|all|rust LOG_DIR}
out=${2:?usage: gpu_verify.sh tests|shipped|all|rust LOG_DIR}
mkdir -p "$out"
for d in tests shipped; do
  if [ ! -d ".gpu/$d" ] && [ -f ".gpu/$d.tar.xz" ]; then
    python3 -c "import sys, tarfile; kw = {'filter': 'tar'} if hasattr(tarfile, 'tar_filter') else {}; tarfile.open(sys.argv[1]).extractall('.gpu', **kw)" ".gpu/$d.tar.xz"
  fi
done
{ nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader; nproc; } >> "$out/gpu.txt"
if [ "$part" = tests ] || [ "$part" = all ] || [ "$part" = rust ]; then
  bash .gpu/run-tests > "$out/tests.log" 2>&1
  echo "run-tests rc=$? $(grep -E '^test binaries' "$out/tests.log" | tail -1)"
  grep -E "FAILED|panicked" "$out/tests.log" | head -5
fi
if [ "$part" = tests ] || [ "$part" = all ]; then
  PINLANE_REQUIRE_GPU=1 timeout 250 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > "$out/pytest.log" 2>&1
  echo "pytest rc=$? $(tail -1 "$out/pytest.log")"
  grep -E "FAILED|Error" "$out/pytest.log" | head -8
fi
if [ "$part" = shipped ] || [ "$part" = all ] || [ "$part" = rust ]; then
  bash .gpu/run-shipped > "$out/shipped.log" 2>&1
  echo "run-shipped rc=$? $(grep -E '^shipped test binaries' "$out/shipped.log" | tail -1)"
  grep -E "FAILED|panicked" "$out/shipped.log" | head -5
  for t in "gpu_foundations memcheck --leak-check full --report-api-errors no" \
           "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" \
           "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
    set -- $t; b=$1; shift
    f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
    echo "=== $b $*" >> "$out/sanitizer.log"
    PINLANE_REQUIRE_GPU=1 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$f" > "$out/one.log" 2>&1
    rc=$?
    cat "$out/one.log" >> "$out/sanitizer.log"
    echo "$b $*: rc=$rc $(grep -E 'ERROR SUMMARY' "$out/one.log" | tail -1) $(grep -E '^test result' "$out/one.log" | tail -1 | cut -c1-60)"
    rm -f "$out/one.log"
  done
fi
