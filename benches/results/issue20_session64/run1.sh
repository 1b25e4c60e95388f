#!/usr/bin/env bash
# Session 64, run 1 (written for the next session with a GPU: none was lent in session
# 64, so it has not run). Measures the D2H idle-stream query of branch
# idea/d2h-idle-query (457b6f9, taken back off main until measured): cherry-pick it, run
# ../shared/gpu/pack --peers (and tests/pack-shipped, benches/gpu_fold.sh), then build
# the "old" artifacts into .gpu/extra from the same tree with the query's condition taken
# out of src/engine/d2h.rs (`&& !current.is_idle()`): the Rust bench
# (`cargo bench --all-features --no-run --bench transfer`, copied to
# .gpu/extra/bench-transfer-old) and the wheel (`python3 -m pip wheel --no-deps -w
# .gpu/extra/oldwheel ./python`); put the line back. Both builds' D2H paths are then the
# same but for the query. Carry .gpu.
# The probe benches/probes/order_query.cu (the cost of ordering a 1 KiB D2H after the
# current stream by an event or by a query, and what the query answers while a kernel
# runs on the legacy, a blocking or a non-blocking stream); then the one-tensor rows of
# the Rust bench, old and new in turn, four processes each; then
# benches/probes/one_small_ab.py, old and new wheels in turn, three processes each.
cd "$(dirname "$0")/../../.." || exit 1
{ nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader; nproc; } > "$OUT/gpu.txt"
nvcc -O3 -arch=sm_90 -o /tmp/order_query benches/probes/order_query.cu -lcuda > "$OUT/order_query.txt" 2>&1 \
  && timeout 60 /tmp/order_query >> "$OUT/order_query.txt" 2>&1
cat "$OUT/order_query.txt"
for r in 1 2 3 4; do
  for b in old new; do
    bin=.gpu/bin/bench-transfer; [ "$b" = old ] && bin=.gpu/extra/bench-transfer-old
    echo "== process $r, $b"
    timeout 60 $bin --only "1 x 1 KiB" 2>&1
  done
done > "$OUT/rust_ab.txt"
grep -E "^==|1 x 1 KiB f32 .*(H2D pageable|D2H pinned out)" "$OUT/rust_ab.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/extra/oldwheel/*.whl
bash .gpu/with-python true
for r in 1 2 3; do
  PYTHONPATH=/tmp/old timeout 120 python3 benches/probes/one_small_ab.py "old$r" 2>&1
  PYTHONPATH=/tmp/site timeout 120 python3 benches/probes/one_small_ab.py "new$r" 2>&1
done > "$OUT/py_ab.txt"
grep -E "^===|one 1 KiB" "$OUT/py_ab.txt"
