#!/usr/bin/env bash
# Compiles kernels/*.cu to PTX (run on the GPU machine, which has nvcc):
#   bash kernels/build.sh [OUT_DIR]     # default: kernels/
# The PTX targets compute_75 so every GPU from Turing on can JIT it, and its `.version`
# line is lowered to 7.5 (the kernels use nothing newer), so drivers from CUDA 11.4 on
# accept it: PTX straight from nvcc 13 says `.version 9.0`, which only 13.x drivers load.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
mkdir -p "$out"
for cu in "$here"/*.cu; do
  name="$(basename "$cu" .cu)"
  nvcc -ptx -arch=compute_75 -O3 -o "$out/$name.ptx.tmp" "$cu"
  sed -e 's/^\.version .*/.version 7.5/' "$out/$name.ptx.tmp" > "$out/$name.ptx"
  rm -f "$out/$name.ptx.tmp"
  echo "built $out/$name.ptx"
done
