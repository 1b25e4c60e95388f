# Session 50, run 5: the first K windows of the staging ring filled with non-temporal
# stores (hot_slots.cu part 6), and pinlane's 8 x 32 MiB pageable H2D traced, twice each.
cd "$(dirname "$0")/../../.."
nvcc -O3 -Xcompiler -march=native -o /tmp/hot benches/probes/hot_slots.cu || exit 1
/tmp/hot first > $OUT/hot_first_1.txt 2>&1
.gpu/bin/bench-transfer --only "8 x 32 MiB" --trace > $OUT/trace_8x32_1.txt 2>&1
/tmp/hot first > $OUT/hot_first_2.txt 2>&1
.gpu/bin/bench-transfer --only "8 x 32 MiB" --trace > $OUT/trace_8x32_2.txt 2>&1
cat $OUT/hot_first_*.txt; grep -E "pageable|^trace 8 x 32 MiB f32 h2d" $OUT/trace_8x32_*.txt | cut -c1-400
