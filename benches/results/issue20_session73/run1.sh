#!/usr/bin/env bash
# Session 73, run 1: the suites on the session's first change (H2D outputs' device blocks
# kept up to 1 MiB instead of 64 KiB, so a 1000 x 1 KiB batch's block is kept), which
# also verifies session 72's e7f03d1 and 913ab59; then that change against the build
# before it (5fa2026's, carried as .gpu/bin/bench-transfer-OLD and .gpu/oldwhl/): the
# Rust bench's "1 KiB" rows, 6 rounds in turn, and benches/probes/flat_ab.py, 2
# processes per wheel in turn.
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L3 cache"
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
bash benches/ab_rounds.sh 6 "1 KiB" bench-transfer-OLD bench-transfer > "$OUT/ab.txt" 2>&1
python3 benches/ab_table.py "$OUT/ab.txt" 2>&1 | tail -14
bash .gpu/with-python true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/old .gpu/oldwhl/*.whl
for r in 1 2; do
  PYTHONPATH=/tmp/old PYTHONUNBUFFERED=1 timeout 60 python3 benches/probes/flat_ab.py "old$r"
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 60 python3 benches/probes/flat_ab.py "new$r"
done > "$OUT/py_ab.txt" 2>&1
cat "$OUT/py_ab.txt" | cut -c1-220
