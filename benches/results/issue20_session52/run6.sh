# Session 52, run 6 (269a47c's package): benches/probes/rounds_vs_blocks.py in two
# processes, each preceded by the process's pure-Python loop speed.
cd "$(dirname "$0")/../../.."
for p in 1 2; do
  echo "=== process $p"
  timeout 150 bash .gpu/with-python python3 -c "
import runpy, sys, time, statistics
def loop():
    v = []
    for _ in range(21):
        t0 = time.perf_counter(); x = 0
        for i in range(20000): x += i & 7
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6
print(f'pure-Python loop at the start: {loop():.0f} us')
sys.argv = ['rounds_vs_blocks.py']
runpy.run_path('benches/probes/rounds_vs_blocks.py', run_name='__main__')
print(f'pure-Python loop at the end: {loop():.0f} us')
" 2>&1
done | tee $OUT/rounds_vs_blocks.txt
