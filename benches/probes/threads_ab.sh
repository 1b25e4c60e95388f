#!/bin/bash
# Probe (session 82): the peers bench (benches/spdl_compare.py) in four processes taking
# turns (A, B, B, A), JSON per process under $OUT, all four outputs in $OUT/py_ab.txt;
# prints each process's H2D rows (pinlane, fastest other, ratio).
#   bash benches/probes/threads_ab.sh threads   # default copy threads (A) against
#                                               # pinlane.configure(copy_threads=8) (B)
#   bash benches/probes/threads_ab.sh omp       # as is (A) against OMP_WAIT_POLICY=PASSIVE
#                                               # (B: torch's OpenMP workers sleep at once
#                                               # after a parallel region, not spin)
# On the GPU machine, after ../shared/gpu/pack --peers.
mode=${1:?usage: threads_ab.sh threads|omp}
run() { # $1 tag, $2 "A" or "B"
  pre=""; envs=""
  if [ "$2" = B ] && [ "$mode" = threads ]; then pre="import pinlane; pinlane.configure(copy_threads=8); "; fi
  if [ "$2" = B ] && [ "$mode" = omp ]; then envs="OMP_WAIT_POLICY=PASSIVE"; fi
  env $envs timeout 140 bash .gpu/with-python python3 -c "${pre}import runpy, sys; sys.argv = ['spdl_compare.py', '--json', '$OUT/py_$1.json']; runpy.run_path('benches/spdl_compare.py', run_name='__main__')" > "/tmp/py_$1.txt" 2>&1
  echo "$1 rc=$?"; grep -E "^\| (8 x|1 GiB|64|1000|1 x)" "/tmp/py_$1.txt" | cut -d'|' -f2-4,10-12
}
tags="${mode}_A1 ${mode}_B1 ${mode}_B2 ${mode}_A2"
for t in $tags; do run "$t" "$(echo "$t" | sed 's/.*_\(.\)./\1/')"; done
for t in $tags; do echo "=== $t"; cat "/tmp/py_$t.txt"; done > "$OUT/py_ab_$mode.txt"
