#!/bin/bash
# Run E (session 43): benches/probes/inplace_floor.cu alone after its review (one timing
# function with an untimed `after`, the inline kernel a template over its size, one helper
# filling the launch's parameters): it builds, and its rows match run D's.
mkdir -p $OUT && /usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/pf benches/probes/inplace_floor.cu > $OUT/probe_build.txt 2>&1
timeout 90 /tmp/pf > $OUT/inplace_floor.txt 2>&1; echo "probe rc=$?"
