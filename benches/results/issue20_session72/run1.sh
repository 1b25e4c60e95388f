#!/usr/bin/env bash
# Session 72, run 1: the suites on 0d15e7a (which also covers session 71's unverified
# af811cc, 3006d1f and a180450: the Python D2H's bounded producer-event wait), then, on
# whatever card came, session 71's pipeline-depth sweep (8, 4 and 6 slots; four rounds).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L3 cache"
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
grep -E "sync_wait|FAILED" "$OUT/verify/pytest.log" | head -5
for round in 1 2 3 4; do
  for p in 8 4 6; do
    for b in "8 x 32 MiB" "1 GiB"; do
      echo "=== round $round p$p ($b)"
      PINLANE_PIPELINE_SLOTS=$p timeout 90 .gpu/bin/bench-transfer --only "$b" 2>&1 | grep -E "limit \(256|H2D pageable|D2H pageable"
    done
  done
done > "$OUT/depth.txt" 2>&1
tail -3 "$OUT/depth.txt"
