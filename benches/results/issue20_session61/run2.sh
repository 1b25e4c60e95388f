#!/usr/bin/env bash
# Session 61, run 2 (the carry of run 1): every check of the final code's CUDA path:
# every test binary (PINLANE_REQUIRE_GPU=1) and the Python suite, then the shipped build and
# compute-sanitizer (memcheck with the leak check on four suites, initcheck, synccheck).
cd "$(dirname "$0")/../../.."
bash benches/gpu_verify.sh all "$OUT"
