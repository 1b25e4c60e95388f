#!/usr/bin/env bash
# Session 72, run 3: the suites on 9a99d13 (a small D2H marks its output range after its
# copies and end flag are queued; a Python test of version bumps on a failed copy_into),
# then that change against the build before it (0d15e7a's, carried as
# .gpu/bin/bench-transfer-OLD and .gpu/oldwhl/): the Rust bench's "1 KiB" rows, 10 rounds
# in turn, and benches/probes/one_small_ab.py, 4 processes per wheel in turn.
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L3 cache"
bash benches/gpu_verify.sh all "$OUT/verify" > "$OUT/verify.log" 2>&1
grep -E "test binaries:|passed|ERROR SUMMARY|FAILED|failed" "$OUT/verify.log" | tail -20
bash benches/ab_rounds.sh 10 "1 KiB" bench-transfer-OLD bench-transfer > "$OUT/ab.txt" 2>&1
python3 benches/ab_table.py "$OUT/ab.txt" | tail -12
bash .gpu/with-python true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/old .gpu/oldwhl/*.whl
for r in 1 2 3 4; do
  PYTHONPATH=/tmp/old PYTHONUNBUFFERED=1 timeout 100 python3 benches/probes/one_small_ab.py "old$r"
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 100 python3 benches/probes/one_small_ab.py "new$r"
done > "$OUT/py_ab.txt" 2>&1
grep -E "===|one 1 KiB D2H|bench: \[1 KiB\] D2H" "$OUT/py_ab.txt"
