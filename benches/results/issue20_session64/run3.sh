#!/usr/bin/env bash
# Session 64, run 3 (loans resumed at the session's end): the D2H idle-stream query
# measured against main. Carry .gpu: the pack of main (ff103cc, "main": the D2H orders by an event at
# every call) and .gpu/extra with the Rust bench and the wheel of main with 457b6f9
# cherry-picked ("idea": an idle current stream is asked, not waited for). The probe
# benches/probes/order_query.cu; the one-tensor rows of the Rust bench, main and idea in
# turn, four processes each; benches/probes/one_small_ab.py, both wheels in turn, three
# processes each.
cd "$(dirname "$0")/../../.." || exit 1
{ nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader; nproc; } > "$OUT/gpu.txt"
nvcc -O3 -arch=sm_90 -o /tmp/order_query benches/probes/order_query.cu -lcuda > "$OUT/order_query.txt" 2>&1 \
  && timeout 60 /tmp/order_query >> "$OUT/order_query.txt" 2>&1
cat "$OUT/order_query.txt"
for r in 1 2 3 4; do
  for b in main idea; do
    bin=.gpu/bin/bench-transfer; [ "$b" = idea ] && bin=.gpu/extra/bench-transfer-idea
    echo "== process $r, $b"
    timeout 60 $bin --only "1 x 1 KiB" 2>&1
  done
done > "$OUT/rust_ab.txt"
grep -E "^==|1 x 1 KiB f32 .*(H2D pageable|D2H pinned out)" "$OUT/rust_ab.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/idea .gpu/extra/ideawheel/*.whl
bash .gpu/with-python true
for r in 1 2 3; do
  PYTHONPATH=/tmp/site timeout 120 python3 benches/probes/one_small_ab.py "main$r" 2>&1
  PYTHONPATH=/tmp/idea timeout 120 python3 benches/probes/one_small_ab.py "idea$r" 2>&1
done > "$OUT/py_ab.txt"
grep -E "^===|one 1 KiB" "$OUT/py_ab.txt"
