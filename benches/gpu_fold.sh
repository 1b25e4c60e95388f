#!/bin/bash
# Folds the GPU machine's test binaries into xz archives, so that every part of .gpu fits
# one carry (64 MiB with the tracked files): .gpu/tests (about 39 MB) and .gpu/shipped
# (about 26 MB) become .gpu/tests.tar.xz and .gpu/shipped.tar.xz (about 4 and 3 MB), and
# .gpu/bin, .gpu/whl and .gpu/pywheels travel as they are (about 26 MB together). Then
# one machine start can run `gpu_verify.sh all`, the benches and the probes, which
# matters when starts are refused more often than not (session 60: six of seven).
# benches/gpu_verify.sh unfolds them on the GPU machine.
#
# Run from the project root after ../shared/gpu/pack [--peers] and bash tests/pack-shipped:
#   bash benches/gpu_fold.sh
set -euo pipefail
for d in tests shipped; do
  if [ -d ".gpu/$d" ]; then
    tar -cJf ".gpu/$d.tar.xz" -C .gpu "$d"
    rm -rf ".gpu/$d"
  fi
done
du -sh .gpu
