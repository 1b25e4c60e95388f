#!/usr/bin/env bash
# Session 61, run 3 (the carry of run 1): the Rust bench once and the peers bench three
# times (A to C), on the final code.
cd "$(dirname "$0")/../../.."
bash benches/peers_runs.sh "$OUT"
