#!/usr/bin/env bash
# Session 56, run 4 (one H200; the shipped build of the session's final engine, `bash
# tests/pack-shipped`): every shipped GPU test binary, then compute-sanitizer on them.
# Not run: no machine was lent after run 3.
cd "$(dirname "$0")/../../.."
bash benches/gpu_verify.sh shipped "$OUT"
