#!/usr/bin/env bash
# Runs the transfer bench under several tuning settings, one process each (the copy pool
# and store modes are fixed per process), and prints the rows that differ between them.
#   bash benches/sweep.sh OUT_DIR [--quick]      # on the GPU machine, after gpu/pack
set -u
out="${1:?out dir}"; shift
bench=.gpu/bin/bench-transfer
: > "$out/sweep.log"
while read -r name envs; do
  [ -z "$name" ] && continue
  echo "=== $name: $envs" | tee -a "$out/sweep.log"
  env $envs "$bench" "$@" --json "$out/sweep-$name.json" > "$out/sweep-$name.log" 2>&1
  grep -E "pageable|at once|1000 x 1 KiB|64 x 3x224" "$out/sweep-$name.log" | tee -a "$out/sweep.log"
  rm -f "$out/sweep-$name.log"
done <<'CONFIGS'
base PINLANE_COPY_THREADS=12
spin0 PINLANE_COPY_THREADS=12 PINLANE_SPIN_US=0
s4d4 PINLANE_COPY_THREADS=12 PINLANE_SLOT_BYTES=4194304 PINLANE_PIPELINE_SLOTS=4
s16d4 PINLANE_COPY_THREADS=12 PINLANE_SLOT_BYTES=16777216 PINLANE_PIPELINE_SLOTS=4
s2d8 PINLANE_COPY_THREADS=12 PINLANE_SLOT_BYTES=2097152 PINLANE_PIPELINE_SLOTS=8
d4 PINLANE_COPY_THREADS=12 PINLANE_PIPELINE_SLOTS=4
d6 PINLANE_COPY_THREADS=12 PINLANE_PIPELINE_SLOTS=6
CONFIGS
