#!/usr/bin/env bash
# Session 55, run 5 (one H200; 5d8929a, the final code of the session's engine and binding):
# the Rust bench once (JSON), then the peers bench three times (A, B, C) with the Rust
# figures beside. It ran these same commands inline; they are now the shared script's.
cd "$(dirname "$0")/../../.."
bash benches/peers_runs.sh "$OUT"
