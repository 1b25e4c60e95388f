# Session 50, run 12: held_drops.py twice (the call alone, the drop of outputs alone, both).
cd "$(dirname "$0")/../../.."
for i in 1 2; do bash .gpu/with-python python3 benches/probes/held_drops.py; done 2>&1 | tee $OUT/held_drops.txt
