#!/usr/bin/env bash
# Session 71, run 2: run 1's sweep again, its rows kept this time (run 1's grep missed
# them): the Rust bench's 8 x 32 MiB and 1 GiB H2D from pageable and page-locked memory
# under seven settings, three rounds in turn, one process each; then torch's page-locked
# way (pin_memory().to(non_blocking=True), then a synchronize) on 8 x 32 MiB in one process.
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
configs='base -
t16 PINLANE_COPY_THREADS=16
t8 PINLANE_COPY_THREADS=8
nt PINLANE_FILL_STORES=streaming
s16 PINLANE_SLOT_BYTES=16777216
s4p16 PINLANE_SLOT_BYTES=4194304 PINLANE_PIPELINE_SLOTS=16
p4 PINLANE_PIPELINE_SLOTS=4'
for round in 1 2 3; do
  while read -r name envs; do
    [ "$envs" = - ] && envs=
    for b in "8 x 32 MiB" "1 GiB"; do
      echo "=== round $round $name ($b): $envs"
      env $envs timeout 90 .gpu/bin/bench-transfer --only "$b" 2>&1 | grep -E "limit \(256|H2D (pageable|pinned)"
    done
  done <<< "$configs"
done > "$OUT/sweep.txt" 2>&1
cat "$OUT/sweep.txt"
python3 - > "$OUT/torch_pinned.txt" 2>&1 <<'PY'
import time, torch
d = torch.device("cuda:0")
src = [torch.randn(8 << 20) for _ in range(8)]
lim_src = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
lim_dst = torch.empty(256 << 20, dtype=torch.uint8, device=d)
def med(f, n=15):
    f(); torch.cuda.synchronize(); ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2]
lim = (256 << 20) / med(lambda: lim_dst.copy_(lim_src, non_blocking=True)) / 1e9
for r in range(3):
    t = med(lambda: [s.pin_memory().to(d, non_blocking=True) for s in src])
    print(f"round {r}: torch pinned 8 x 32 MiB {t*1e6:.0f} us, {(256 << 20) / t / 1e9:.1f} GB/s, {(256 << 20) / t / 1e9 / lim:.3f} of the limit {lim:.1f} GB/s")
PY
cat "$OUT/torch_pinned.txt"
