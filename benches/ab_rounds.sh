#!/bin/bash
# The Rust bench's builds in turn, on the GPU machine: ROUNDS rounds, each running every
# build once (one process each) on the rows whose name contains ONLY, so that each round
# pairs the builds on the same minutes of the same host. Output for benches/ab_table.py.
# Carry each build as .gpu/bin/<name> (the current one is .gpu/bin/bench-transfer).
#
#   bash benches/ab_rounds.sh 8 "1 KiB" bench-transfer-OLD bench-transfer > "$OUT/ab.txt"
#   python3 benches/ab_table.py "$OUT/ab.txt"
#
# Between processes on one host a row the builds do not change moved by 25 us of 65 in
# session 61 (docs/performance.md, "Run-to-run variation"): a few microseconds need many
# rounds, read as paired differences, with such a row as the control.
rounds=${1:?usage: ab_rounds.sh ROUNDS ONLY BUILD...}
only=${2:?usage: ab_rounds.sh ROUNDS ONLY BUILD...}
shift 2
[ $# -ge 1 ] || { echo "ab_rounds.sh: name at least one build" >&2; exit 2; }
for r in $(seq 1 "$rounds"); do
  for b in "$@"; do
    echo "== process $r, $b"
    timeout 120 ".gpu/bin/$b" --only "$only" 2>&1
  done
done
