#!/bin/bash
# Run P (session 34): the process spread probe, 8 processes free, then 4 pinned to each
# half of the cores; the machine's topology.
cd "$(dirname "$0")/.."
FINAL=$OUT; OUT=/tmp/rp; mkdir -p $OUT
trap 'tar czf $FINAL/runP.tar.gz -C /tmp rp' EXIT
(lscpu; numactl --hardware 2>&1; cat /sys/devices/system/node/online 2>&1; nproc) > $OUT/topology.txt 2>&1
grep -E "^(Model name|Socket|Core|Thread|NUMA|CPU\(s\))" $OUT/topology.txt
bash .gpu/with-python true
for i in $(seq 8); do bash .gpu/with-python timeout 60 python3 benches/probes/process_spread.py; done 2>&1 | tee $OUT/free.txt
n=$(nproc); h=$((n/2))
for i in 1 2 3 4; do bash .gpu/with-python timeout 60 taskset -c 0-$((h-1)) python3 benches/probes/process_spread.py; done 2>&1 | tee $OUT/low_half.txt
for i in 1 2 3 4; do bash .gpu/with-python timeout 60 taskset -c $h-$((n-1)) python3 benches/probes/process_spread.py; done 2>&1 | tee $OUT/high_half.txt
