#!/usr/bin/env bash
# Pageable H2D speed and CPU cost against the number of copy threads (one bench process
# per setting: the copy pool is fixed per process), for choosing cores against speed.
#   bash benches/threads_curve.sh OUT_DIR [--quick | --only ROW]   # on the GPU machine, after gpu/pack
# THREADS="8 12" sets the thread counts tried (default 1 2 4 8 12 16).
set -u
out="${1:?out dir}"; shift
bench=.gpu/bin/bench-transfer
printf '%-8s %-22s %8s %8s %10s\n' threads batch GB/s "x limit" "CPU s/GB" | tee "$out/threads.txt"
for t in ${THREADS:-1 2 4 8 12 16}; do
  PINLANE_COPY_THREADS=$t "$bench" "$@" --json "$out/threads-$t.json" > "$out/threads-$t.log" 2>&1 || {
    echo "threads $t: bench failed (see $out/threads-$t.log)" | tee -a "$out/threads.txt"; continue; }
  python3 - "$t" "$out/threads-$t.json" <<'PY' | tee -a "$out/threads.txt"
import json, sys
t, path = sys.argv[1], sys.argv[2]
for r in json.load(open(path))["rows"]:
    if r["direction"] == "H2D pageable" and r["batch"] in ("8 x 32 MiB f32", "1 GiB f32", "64 x 3x224x224 u8", "1000 x 1 KiB f32"):
        print(f"{t:<8} {r['batch']:<22} {r['gbs']:8.2f} {r['fraction_of_limit']:8.3f} {r['cpu_s_per_gb']:10.3f}")
PY
done
