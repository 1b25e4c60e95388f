#!/usr/bin/env bash
# Session 58, run 1 (one H200; carry .gpu after ../shared/gpu/pack --peers with .gpu/bin and
# .gpu/whl moved aside): every test binary with PINLANE_REQUIRE_GPU=1 and the Python suite.
cd "$(dirname "$0")/../../.."
bash benches/gpu_verify.sh tests "$OUT"
