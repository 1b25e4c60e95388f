#!/usr/bin/env bash
# Session 73, run 2 (the machine of run 1, warm): the peers bench on the session's code
# (benches/peers_runs.sh: the Rust bench once, benches/spdl_compare.py three times).
cd "$(dirname "$0")/../../.." || exit 1
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader
lscpu | grep -E "Model name|L3 cache"
bash benches/peers_runs.sh "$OUT/peers"
