#!/usr/bin/env bash
# Session 58, run 3 (one H200, the machine of runs 1 and 2; carry .gpu after
# ../shared/gpu/pack --peers with .gpu/tests moved aside): the Rust bench once and the
# peers bench three times (A to C), session 58's final engine.
cd "$(dirname "$0")/../../.."
bash benches/peers_runs.sh "$OUT"
