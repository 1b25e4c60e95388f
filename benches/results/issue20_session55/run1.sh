#!/bin/bash
# Session 55, run 1: the images' H2D handover split by the binding's new marks
# ("hook entered", "run in torch", "run split"), torch's pieces alone, and the Rust
# bench's traced images beside.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/run1.txt"
for p in 1 2; do
  echo "== images_split process $p" >> "$OUT/run1.txt"
  bash .gpu/with-python python3 benches/probes/images_split.py >> "$OUT/run1.txt" 2>&1
done
echo "== handover_pieces" >> "$OUT/run1.txt"
bash .gpu/with-python python3 benches/probes/handover_pieces.py >> "$OUT/run1.txt" 2>&1
echo "== bench-transfer --trace --only 3x224" >> "$OUT/run1.txt"
.gpu/bin/bench-transfer --trace --only 3x224 >> "$OUT/run1.txt" 2>&1
tail -3 "$OUT/run1.txt"
