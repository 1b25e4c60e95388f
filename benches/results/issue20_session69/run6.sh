#!/usr/bin/env bash
# Session 69, run 6: the peers bench on 44d307c (the carry of run 1).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > "$OUT/gpu.txt"
bash benches/peers_runs.sh "$OUT/peers"
