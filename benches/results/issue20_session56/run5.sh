#!/usr/bin/env bash
# Session 56, run 5 (for a later session; not run; extended in session 57): where the Rust
# 1000 x 1 KiB D2H's rebuild phase goes on the H200's host (45-46 us there in run 2, 18.6
# us for the same host code on the simulated device of a CI machine). Three rounds of the
# traced bench, end flags on (the default) and off (PINLANE_SPIN_US=0: no flag's driver
# call in that phase) in turn; each traced call's page faults and context switches (the
# bench prints them since session 57); then `bench-refcount` (no GPU): what an atomic
# reference count per output tensor costs this host's CPU against one per batch. Carry
# .gpu/bin after ../shared/gpu/pack.
cd "$(dirname "$0")/../../.."
o=$OUT/run5.txt
lscpu | grep -E "Model name|MHz" >> $o
for r in 1 2 3; do
  for spin in default 0; do
    echo "== round $r spin $spin" >> $o
    if [ $spin = default ]; then
      timeout 60 .gpu/bin/bench-transfer --trace --only "1000 x 1 KiB" >> $o 2>&1
    else
      PINLANE_SPIN_US=0 timeout 60 .gpu/bin/bench-transfer --trace --only "1000 x 1 KiB" >> $o 2>&1
    fi
  done
done
for r in 1 2; do
  echo "== bench-refcount $r" >> $o
  timeout 120 .gpu/bin/bench-refcount >> $o 2>&1
done
grep -E "^==|D2H pinned out|trace 1000 x 1 KiB f32 d2h (\(|: the calling)|hot:|cold:" $o | cut -c1-260
