#!/bin/bash
# Run D (session 42): benches/probes/inplace_floor.cu alone, with its launch-call rows
# (the host time of one launch or one DMA submission, the synchronisation untimed).
mkdir -p $OUT && /usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/pf benches/probes/inplace_floor.cu > $OUT/probe_build.txt 2>&1
timeout 90 /tmp/pf > $OUT/inplace_floor.txt 2>&1
