#!/usr/bin/env bash
# Session 58, run 2 (one H200; carry .gpu holding only .gpu/shipped from `bash
# tests/pack-shipped` and .gpu/bin from ../shared/gpu/pack): the shipped test binaries and
# compute-sanitizer (session 56's run4.sh), then session 56's run5.sh (the traced 1000 x 1
# KiB D2H with end flags on and off, each call's page faults, bench-refcount, lscpu).
cd "$(dirname "$0")/../../.."
bash benches/gpu_verify.sh shipped "$OUT"
bash benches/results/issue20_session56/run5.sh
