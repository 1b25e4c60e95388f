#!/usr/bin/env bash
# Session 70, run 7: the peers bench on the final code (19e644d), the machine of run 6.
cd "$(dirname "$0")/../../.." || exit 1
bash benches/peers_runs.sh "$OUT/peers" > "$OUT/peers.log" 2>&1
tail -60 "$OUT/peers.log"
