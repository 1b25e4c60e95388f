#!/usr/bin/env bash
# Session 70, run 1: the suites on d65e153 (b2d879a of session 69, never run on a GPU, plus
# the forked child's settle/shutdown refusal), then the binding's phases of one 1 KiB D2H
# (benches/probes/one_d2h_phases.py, three processes). Carry: .gpu packed at d65e153.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
for p in 1 2 3; do
  timeout 120 bash .gpu/with-python python3 benches/probes/one_d2h_phases.py "process $p" 2>&1
done > "$OUT/phases.txt"
cat "$OUT/phases.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
