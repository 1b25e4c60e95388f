# Session 50, run 6: the GPU suite and the Python suite on HEAD, then small H2D under a
# busy Python thread (gil_contention_h2d.py), twice.
cd "$(dirname "$0")/../../.."
bash .gpu/run-tests > $OUT/run-tests.log 2>&1; tail -1 $OUT/run-tests.log; grep -E "FAILED|panicked" $OUT/run-tests.log | head
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "FAILED|Error" $OUT/pytest.log | head -5
for i in 1 2; do bash .gpu/with-python python3 benches/probes/gil_contention_h2d.py; done > $OUT/gil_h2d.txt 2>&1; cat $OUT/gil_h2d.txt
