#!/usr/bin/env bash
# Two pinlane processes at once on a 2-GPU machine (LOCAL_RANK 0 and 1), each against its
# own solo figure measured in the same session: does one process slow the other?
#   bash benches/two_gpus.sh OUT_DIR [bench args, e.g. --quick]
# Needs the bench binary from ../shared/gpu/pack at .gpu/bin/bench-transfer. Writes
# solo0/solo1/both0/both1 .txt and .json into OUT_DIR.
set -uo pipefail
out="${1:?OUT_DIR}"; shift
bin="$(dirname "$0")/../.gpu/bin/bench-transfer"
mkdir -p "$out"
for r in 0 1; do
  LOCAL_RANK=$r "$bin" --json "$out/solo$r.json" "$@" > "$out/solo$r.txt" 2>&1
done
LOCAL_RANK=0 "$bin" --json "$out/both0.json" "$@" > "$out/both0.txt" 2>&1 &
p0=$!
LOCAL_RANK=1 "$bin" --json "$out/both1.json" "$@" > "$out/both1.txt" 2>&1 &
p1=$!
# While both run: which processes hold a context on which GPU.
sleep 5
nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv > "$out/apps.csv" 2>&1
nvidia-smi --query-gpu=index,uuid --format=csv >> "$out/apps.csv" 2>&1
echo "pids: rank0=$p0 rank1=$p1" >> "$out/apps.csv"
wait $p0; wait $p1
python3 - "$out" <<'PY'
import json, sys, os
d = sys.argv[1]
def rows(name):
    with open(os.path.join(d, name)) as f:
        return {(r["batch"], r["direction"]): r for r in json.load(f)["rows"]}
print(f"{'config':<22} {'direction':<18} {'solo GB/s':>10} {'both GB/s':>10} {'ratio':>6}")
for r in "01":
    solo, both = rows(f"solo{r}.json"), rows(f"both{r}.json")
    print(f"-- LOCAL_RANK={r}")
    for k, s in solo.items():
        b = both.get(k)
        if b is None or not s.get("gbs"):
            continue
        print(f"{k[0]:<22} {k[1]:<18} {s['gbs']:>10.1f} {b['gbs']:>10.1f} {b['gbs']/s['gbs']:>6.2f}")
PY
