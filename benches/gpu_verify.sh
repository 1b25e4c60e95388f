#!/bin/bash
# The GPU checks a run makes after the last change to the CUDA path, on the GPU machine
# (after ../shared/gpu/pack), logs into directory $1: the shipped test binaries, every
# test binary with PINLANE_REQUIRE_GPU=1 (.gpu/run-tests), the Python suite with torch,
# and compute-sanitizer (memcheck --leak-check full on gpu_semantics, gpu_roundtrip and
# gpu_into; initcheck on gpu_roundtrip; synccheck on gpu_into). Prints each one's closing
# line. Run from the project root: bash benches/gpu_verify.sh "$OUT"
out=${1:?usage: gpu_verify.sh LOG_DIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > "$out/gpu.txt"
nproc >> "$out/gpu.txt"
bash .gpu/run-shipped > "$out/shipped.log" 2>&1
echo "shipped rc=$? $(tail -1 "$out/shipped.log")"
bash .gpu/run-tests > "$out/rust.log" 2>&1
echo "tests rc=$? $(tail -1 "$out/rust.log")"
grep -E "FAILED|panicked" "$out/rust.log" | head -5
PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > "$out/py.log" 2>&1
echo "pytest rc=$? $(tail -1 "$out/py.log")"
grep -E "FAILED|Error" "$out/py.log" | head -8
for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" \
         "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
  set -- $t; b=$1; shift; tool=$1
  f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
  log="$out/san_${b}_$tool.log"
  PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$f" > "$log" 2>&1
  echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-40)"
done
