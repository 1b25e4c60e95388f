# Session 52, run 2 (the package as run 1): benches/probes/small_rounds_why.py in two
# processes: what makes pinlane's 1000 x 1 KiB calls slower in rounds.
cd "$(dirname "$0")/../../.."
for p in 1 2; do
  echo "=== process $p"
  timeout 120 bash .gpu/with-python python3 benches/probes/small_rounds_why.py 2>&1
done | tee $OUT/small_rounds_why.txt
