#!/usr/bin/env bash
# Session 53, run 5 (one H200; the binding with its phase timer, as run 4):
# images_split.py (now with the binding's phases of the traced public calls) in two
# processes.
cd "$(dirname "$0")/../../.."
for p in 1 2; do
  echo "=== process $p"; timeout 150 bash .gpu/with-python python3 benches/probes/images_split.py
done > $OUT/images_split.txt 2>&1; echo "images_split rc=$?"; cat $OUT/images_split.txt
