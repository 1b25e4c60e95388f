#!/usr/bin/env bash
# Session 69, run 9: the peers bench on the final code (the carry of run 7).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi -L > "$OUT/gpu.txt"
bash benches/peers_runs.sh "$OUT/peers"
