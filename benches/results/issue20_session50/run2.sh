# Session 50, run 2: where one small D2H's time goes (new engine marks), the Rust rows
# traced, and what a slow process does differently (slow_mode.py, six processes).
cd "$(dirname "$0")/../../.."
for i in 1 2; do bash .gpu/with-python python3 benches/probes/one_d2h_split.py > $OUT/split_$i.txt 2>&1; done
.gpu/bin/bench-transfer --only "1 KiB f32" --trace > $OUT/rust_trace.txt 2>&1
for i in 1 2 3 4 5 6; do bash .gpu/with-python python3 benches/probes/slow_mode.py; done > $OUT/slow_mode.txt 2>&1
tail -n 20 $OUT/split_1.txt; grep -E "^trace 1 x|^trace 1000 x" $OUT/rust_trace.txt | grep median; cat $OUT/slow_mode.txt | cut -c1-900
