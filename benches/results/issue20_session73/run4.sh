#!/usr/bin/env bash
# Session 73, run 4 (run 3's machine, warm; given as one command line): the shipped build
# and compute-sanitizer on ba92ce8.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p "$OUT/verify" && bash benches/gpu_verify.sh shipped "$OUT/verify"
