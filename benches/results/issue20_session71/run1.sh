#!/usr/bin/env bash
# Session 71, run 1: the suites on 6d3b67e (a forked child's runtime calls never wait for
# a parent's lock), then where this host's 8 x 32 MiB H2D from pageable memory stands:
# the Rust bench's row under seven settings, two rounds in turn (one process each), the
# library-free ring of benches/probes/hot_slots.cu (part 2: 256 MiB through 8 x 8 MiB
# slots, 12 threads, per fill style), and torch's page-locked way in one process.
cd "$(dirname "$0")/../../.." || exit 1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  lscpu | grep -E "Model name|Socket\(s\)|NUMA node\(s\)|L3 cache"; } > "$OUT/host.txt" 2>&1
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
configs='base -
t16 PINLANE_COPY_THREADS=16
t8 PINLANE_COPY_THREADS=8
nt PINLANE_FILL_STORES=streaming
s16 PINLANE_SLOT_BYTES=16777216
s4p16 PINLANE_SLOT_BYTES=4194304 PINLANE_PIPELINE_SLOTS=16
p4 PINLANE_PIPELINE_SLOTS=4'
for round in 1 2; do
  while read -r name envs; do
    [ "$envs" = - ] && envs=
    echo "=== round $round $name: $envs"
    env $envs timeout 90 .gpu/bin/bench-transfer --only "8 x 32 MiB" 2>&1 | grep -E "limit|8 x 32 MiB f32 \| H2D (pageable|pinned)"
  done <<< "$configs"
done > "$OUT/sweep.txt" 2>&1
cat "$OUT/sweep.txt"
cd benches/probes || exit 1
nvcc -O3 -Xcompiler -march=native -o /tmp/hot hot_slots.cu > /tmp/hot.build 2>&1 || tail -5 /tmp/hot.build
timeout 120 /tmp/hot > "$OUT/hot_slots.txt" 2>&1
tail -25 "$OUT/hot_slots.txt"
