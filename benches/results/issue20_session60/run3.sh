#!/usr/bin/env bash
# Session 60, run 3 (carry .gpu as for run 1): the Rust bench once and the peers bench
# three times (A to C), on cc64bbb.
cd "$(dirname "$0")/../../.."
bash benches/peers_runs.sh "$OUT"
