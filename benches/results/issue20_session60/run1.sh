#!/usr/bin/env bash
# Session 60, run 1 (one device call; carry .gpu after ../shared/gpu/pack --peers on
# cc64bbb, with .gpu/tests packed as .gpu/tests.tar.xz so that one carry holds it all,
# and .gpu/bin/bench-transfer-c294a8a the same bench built on c294a8a, the commit before):
#   1. every test binary and the Python suite (session 58's last three commits had not
#      been GPU-verified; cc64bbb changes Value's visit);
#   2. the floor probe for 1000 x 1 KiB pageable H2D (benches/probes/many_small_floor.cu,
#      built here);
#   3. the Rust bench's 1 KiB rows, old and new build in turn, three processes each.
cd "$(dirname "$0")/../../.."
python3 -c "import tarfile; tarfile.open('.gpu/tests.tar.xz').extractall('.gpu')"
bash benches/gpu_verify.sh tests "$OUT"
nvcc -O3 -Xcompiler -march=native -o /tmp/many_small_floor benches/probes/many_small_floor.cu -lcuda -lpthread \
  && timeout 120 /tmp/many_small_floor > "$OUT/floor.txt" 2>&1
echo "probe rc=$?"; cat "$OUT/floor.txt"
for r in 1 2 3; do
  for b in bench-transfer-c294a8a bench-transfer; do
    echo "== process $r, $b"
    timeout 60 .gpu/bin/$b --only "1 KiB" 2>&1
  done
done > "$OUT/rust_small_ab.txt"
grep -E "^==|1 KiB f32  " "$OUT/rust_small_ab.txt"
