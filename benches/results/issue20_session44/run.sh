#!/bin/bash
# Session 44, issue 20: end flags (a blocking call's stream sets a word of page-locked
# memory after its copies; the calling thread spins on it before waiting in the driver).
# Part 1: every GPU test binary (.gpu/run-tests) and the Python suite with torch.
# Part 2: the shipped test binaries and compute-sanitizer (as benches/gpu_verify.sh).
# Part 3: benches/probes/wait_floor.cu; the Rust bench's 1 KiB rows, old (4f28d61:
# .gpu/ab/bench-transfer-old) and new in turn, three pairs; `python -m pinlane.bench`
# for one 1 KiB tensor, new and old wheels (.gpu/ab/old) in turn, three pairs.
# Part 4: the probe (with H2D and kernel rows added after part 3) twice, and five more
# pairs of the Rust bench's 1 KiB rows. Part 5: old and new, with the default spin and
# with PINLANE_SPIN_US=0 (end flags off), the one 1 KiB tensor rows, three rounds.
# Part 6: the probe (with its "after flags" rows) three times. Part 7: the new bench
# (a traced D2H into pageable outputs added), traced, with the default spin and with
# PINLANE_SPIN_US=0, three rounds. Part 8: end flags for D2H only, against old, the
# 1 KiB rows traced, three pairs. Part 9: the final code, the 1 KiB rows traced old
# and new x3, and pinlane.bench's one 1 KiB tensor new and old wheels x3. Parts 1 and 2
# were run again after part 9. Part 10: after the review's mends, part 1's checks and
# the one-tensor rows twice.
# The .gpu folder is carried in two halves (the carry limit): part 1 with .gpu/tests,
# parts 2 and 3 with .gpu/shipped, .gpu/bin and .gpu/ab.
cd "$(dirname "$0")/../../.."
PART=${1:-1}
FINAL=$OUT; OUT=/tmp/r$PART; mkdir -p $OUT
trap 'tar czf $FINAL/run$PART.tar.gz -C /tmp r$PART' EXIT
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
if [ $PART = 1 ]; then
  bash .gpu/run-tests > $OUT/rust.log 2>&1
  echo "tests rc=$? $(tail -1 $OUT/rust.log)"
  grep -E "FAILED|panicked" $OUT/rust.log | head -5
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
elif [ $PART = 10 ]; then
  # After the review's mends (a flag no longer releases the retained registry; no flag
  # where it would need a larger block; atomics for the word): part 1's checks again, then
  # the new bench's one 1 KiB tensor rows twice.
  bash .gpu/run-tests > $OUT/rust.log 2>&1
  echo "tests rc=$? $(tail -1 $OUT/rust.log)"
  grep -E "FAILED|panicked" $OUT/rust.log | head -5
  PINLANE_REQUIRE_GPU=1 timeout 200 bash .gpu/with-python python3 -m pytest -q -s -p no:cacheprovider python/tests > $OUT/py.log 2>&1
  echo "pytest rc=$? $(tail -1 $OUT/py.log)"
  grep -E "FAILED|Error" $OUT/py.log | head -8
  for i in 1 2; do
    timeout 60 .gpu/bin/bench-transfer --only "1 x 1 KiB" --trace --json $OUT/bench_new$i.json > $OUT/bench_new$i.txt 2>&1; echo "bench new$i rc=$?"
    grep -E "^1 x|^trace 1 x 1 KiB f32 d2h \(" $OUT/bench_new$i.txt | cut -c1-160
  done
elif [ $PART = 2 ]; then
  bash .gpu/run-shipped > $OUT/shipped.log 2>&1
  echo "shipped rc=$? $(tail -1 $OUT/shipped.log)"
  for t in "gpu_semantics memcheck --leak-check full" "gpu_roundtrip memcheck --leak-check full" \
           "gpu_into memcheck --leak-check full" "gpu_roundtrip initcheck" "gpu_into synccheck"; do
    set -- $t; b=$1; shift; tool=$1
    f=$(ls .gpu/shipped/ | grep "^$b" | head -1)
    log="$OUT/san_${b}_$tool.log"
    PINLANE_REQUIRE_GPU=1 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool "$@" ".gpu/shipped/$f" > "$log" 2>&1
    echo "$b $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -1) $(grep -E '^test result' "$log" | tail -1 | cut -c1-40)"
  done
elif [ $PART = 4 ]; then
  # More pairs: the probe twice, the Rust bench's 1 KiB rows old and new in turn x5.
  /usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/wait_floor benches/probes/wait_floor.cu -lcuda > $OUT/probe_build.txt 2>&1
  for i in 1 2; do timeout 60 /tmp/wait_floor > $OUT/wait_floor$i.txt 2>&1; echo "probe rc=$?"; done
  for i in 4 5 6 7 8; do
    for v in old new; do
      b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/ab/bench-transfer-old
      timeout 100 $b --only "1 KiB" --json $OUT/bench_$v$i.json > $OUT/bench_$v$i.txt 2>&1; echo "bench $v$i rc=$?"
    done
  done
elif [ $PART = 5 ]; then
  # Why D2H into pageable outputs (no end flag) took longer in the new build: the one
  # 1 KiB tensor rows, old and new, each with the default spin and with
  # PINLANE_SPIN_US=0 (which turns end flags off), in turn x3.
  for i in 1 2 3; do
    for v in old new old0 new0; do
      b=.gpu/bin/bench-transfer; case $v in old*) b=.gpu/ab/bench-transfer-old;; esac
      s=50; case $v in *0) s=0;; esac
      PINLANE_SPIN_US=$s timeout 100 $b --only "1 x 1 KiB" --json $OUT/bench_$v$i.json > $OUT/bench_$v$i.txt 2>&1; echo "bench $v$i rc=$?"
      grep -E "^1 x" $OUT/bench_$v$i.txt | cut -c1-100
    done
  done
elif [ $PART = 6 ]; then
  # The probe with its "after flags" rows, three times.
  /usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/wait_floor benches/probes/wait_floor.cu -lcuda > $OUT/probe_build.txt 2>&1
  for i in 1 2 3; do timeout 60 /tmp/wait_floor > $OUT/wait_floor$i.txt 2>&1; echo "probe rc=$?"; done
elif [ $PART = 7 ]; then
  # The new bench with a traced "d2h pageable out" call added (no library change):
  # the one 1 KiB tensor rows traced, default spin and PINLANE_SPIN_US=0 in turn x3.
  for i in 1 2 3; do
    for s in 50 0; do
      PINLANE_SPIN_US=$s timeout 100 .gpu/bin/bench-transfer --only "1 x 1 KiB" --trace --json $OUT/bench_s$s-$i.json > $OUT/bench_s$s-$i.txt 2>&1; echo "bench s$s-$i rc=$?"
      grep -E "^1 x|^trace .*median us per phase" $OUT/bench_s$s-$i.txt | cut -c1-260
    done
  done
elif [ $PART = 8 ]; then
  # End flags for D2H into page-locked outputs only (H2D waits in the driver again:
  # .gpu/ab/bench-transfer-d2honly), against old, the 1 KiB rows, traced, x3.
  for i in 1 2 3; do
    for v in old d2honly; do
      b=.gpu/ab/bench-transfer-$v
      timeout 100 $b --only "1 KiB" --trace --json $OUT/bench_$v$i.json > $OUT/bench_$v$i.txt 2>&1; echo "bench $v$i rc=$?"
      grep -E "^1 x|^1000 x|^trace .*median us per phase" $OUT/bench_$v$i.txt | cut -c1-260
    done
  done
elif [ $PART = 9 ]; then
  # The final code (end flags for D2H into page-locked outputs only, queued right after
  # the copies): the 1 KiB rows traced, old and new in turn x3; then pinlane.bench's one
  # 1 KiB tensor, new and old wheels in turn x3.
  for i in 1 2 3; do
    for v in old new; do
      b=.gpu/bin/bench-transfer; [ $v = old ] && b=.gpu/ab/bench-transfer-old
      timeout 100 $b --only "1 KiB" --trace --json $OUT/bench_$v$i.json > $OUT/bench_$v$i.txt 2>&1; echo "bench $v$i rc=$?"
    done
  done
  bash .gpu/with-python true
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oldsite .gpu/ab/old/*.whl; echo "old wheel rc=$?"
  for i in 1 2 3; do
    for v in new old; do
      if [ $v = old ]; then P=/tmp/oldsite:/tmp/site; else P=/tmp/site; fi
      PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 60 python3 -m pinlane.bench --batch 1x256:float32 > $OUT/one_${v}$i.txt 2>&1; echo "bench one $v$i rc=$?"; grep -E "^\| 1 x" $OUT/one_${v}$i.txt | cut -c1-200
    done
  done
else
  /usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -o /tmp/wait_floor benches/probes/wait_floor.cu -lcuda > $OUT/probe_build.txt 2>&1
  timeout 60 /tmp/wait_floor > $OUT/wait_floor.txt 2>&1; echo "probe rc=$?"
  grep -E "^(D2H async|whole|H2D async)" $OUT/wait_floor.txt | cut -c1-110
  bench() { # tag binary
    timeout 100 $2 --only "1 KiB" --json $OUT/bench_$1.json > $OUT/bench_$1.txt 2>&1; echo "bench $1 rc=$?"
    grep -E "^\| [0-9]" $OUT/bench_$1.txt | cut -c1-150
  }
  for i in 1 2 3; do
    bench old$i .gpu/ab/bench-transfer-old
    bench new$i .gpu/bin/bench-transfer
  done
  bash .gpu/with-python true
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oldsite .gpu/ab/old/*.whl; echo "old wheel rc=$?"
  for i in 1 2 3; do
    for v in new old; do
      if [ $v = old ]; then P=/tmp/oldsite:/tmp/site; else P=/tmp/site; fi
      PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout 60 python3 -m pinlane.bench --batch 1x256:float32 > $OUT/one_${v}$i.txt 2>&1; echo "bench one $v$i rc=$?"; grep -E "^\||limit" $OUT/one_${v}$i.txt | cut -c1-200
    done
  done
fi
