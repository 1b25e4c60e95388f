#!/bin/bash
# Probe (session 83): the Rust bench's 8 x 32 MiB pageable H2D row under staging shapes
# and copy-thread counts, one process per setting (the copy pool and slots are fixed per
# process), in ROUNDS rounds that each run every setting once in turn, so that each round
# pairs the settings on the same minutes of the same host. The question: does a window
# the size of a tensor (torch's per-tensor pipeline: fill one 32 MiB tensor's page-locked
# copy while the previous one crosses the link), or another thread count, stage this row
# faster than the default ring (8 slots of 8 MiB, 12 threads) on this host?
#   bash benches/probes/slots_8x32.sh OUT_DIR [ROUNDS]    # on the GPU machine, after gpu/pack
# Prints one line per process: setting, round, GB/s, x limit, CPU s/GB; $OUT_DIR/slots.txt.
out=${1:?usage: slots_8x32.sh OUT_DIR [ROUNDS]}
rounds=${2:-2}
mkdir -p "$out"
settings="base:
t8:PINLANE_COPY_THREADS=8
t16:PINLANE_COPY_THREADS=16
s32x2:PINLANE_SLOT_BYTES=33554432,PINLANE_PIPELINE_SLOTS=2
s32x2_t16:PINLANE_SLOT_BYTES=33554432,PINLANE_PIPELINE_SLOTS=2,PINLANE_COPY_THREADS=16
s16x4:PINLANE_SLOT_BYTES=16777216,PINLANE_PIPELINE_SLOTS=4
nt:PINLANE_FILL_STORES=streaming"
for r in $(seq 1 "$rounds"); do
  while IFS=: read -r name envs; do
    env $(echo "$envs" | tr ',' ' ') timeout 60 .gpu/bin/bench-transfer --only "8 x 32 MiB" \
      --json "$out/$name-$r.json" > "$out/$name-$r.log" 2>&1 || { echo "$name $r failed"; continue; }
    python3 - "$name" "$r" "$out/$name-$r.json" <<'PY'
import json, sys
name, r, path = sys.argv[1:]
for row in json.load(open(path))["rows"]:
    if row["direction"] == "H2D pageable":
        print(f"{name:<10} {r} {row['gbs']:7.2f} {row['fraction_of_limit']:7.3f} {row['cpu_s_per_gb']:7.3f}")
PY
  done <<< "$settings"
done | tee "$out/slots.txt"
