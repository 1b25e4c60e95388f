#!/usr/bin/env bash
# Session 62, run 2: the copy threads' job pickup with try_lock (bench-transfer-trylock)
# against the build before it (bench-transfer, a788aaf), in turn, many rounds; then one
# traced process of each. Run from the project root with .gpu carried.
cd "$(dirname "$0")/../../.."
out=${OUT:?}/ab
mkdir -p "$out"
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > "$out/gpu.txt"; nproc >> "$out/gpu.txt"
B="bench-transfer bench-transfer-trylock"
bash benches/ab_rounds.sh 10 "1000 x 1 KiB" $B > "$out/ab_1000.txt"
python3 benches/ab_table.py "$out/ab_1000.txt"
bash benches/ab_rounds.sh 6 "x 32 MiB" $B > "$out/ab_32m.txt"
python3 benches/ab_table.py "$out/ab_32m.txt"
bash benches/ab_rounds.sh 6 "3x224" $B > "$out/ab_images.txt"
python3 benches/ab_table.py "$out/ab_images.txt"
for b in $B; do echo "== traced, $b"; timeout 60 .gpu/bin/$b --trace --only "1000 x 1 KiB" 2>&1; done > "$out/trace.txt"
grep -E "^== |h2d \(median|d2h pageable out \(median" "$out/trace.txt"
