#!/usr/bin/env bash
# Session 56, run 3 (one H200; the final engine and binding of the session): the Rust
# bench once (JSON), then the peers bench three times (A, B, C) with the Rust figures
# beside (as session 55's run 5). It ran these same commands inline; they are now the
# shared script's.
cd "$(dirname "$0")/../../.."
bash benches/peers_runs.sh "$OUT"
