# Session 52, run 3 (the package as run 1): benches/probes/images_split.py in two
# processes, the Rust bench's traced images (bench-transfer --trace --only 3x224) between
# them, then the peers bench once more (C).
cd "$(dirname "$0")/../../.."
{
  echo "=== images_split, process 1"
  timeout 100 bash .gpu/with-python python3 benches/probes/images_split.py 2>&1
  echo "=== bench-transfer --trace --only 3x224"
  timeout 100 .gpu/bin/bench-transfer --trace --only 3x224 2>&1
  echo "=== images_split, process 2"
  timeout 100 bash .gpu/with-python python3 benches/probes/images_split.py 2>&1
} > $OUT/images_split.txt
grep -vE "^(Processing|Installing|Requirement|Successfully|WARNING)" $OUT/images_split.txt | cut -c1-400
timeout 150 bash .gpu/with-python python3 benches/spdl_compare.py --json $OUT/py_compare_C.json --rust benches/results/issue20_session52/run1/rust.json > $OUT/py_compare_C.txt 2>&1; echo "spdl_compare C rc=$?"
grep -E "^\| [0-9o]|limit|speed|rounds" $OUT/py_compare_C.txt | cut -c1-300
