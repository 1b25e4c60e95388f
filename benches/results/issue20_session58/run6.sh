#!/usr/bin/env bash
# Session 58, run 6 (one H200; carry .gpu after ../shared/gpu/pack --peers with .gpu/bin
# and .gpu/whl moved aside): every test binary and the Python suite again, on the
# session's final code (the second review's mends: a test, an error's text, docs).
cd "$(dirname "$0")/../../.."
bash benches/gpu_verify.sh tests "$OUT"
