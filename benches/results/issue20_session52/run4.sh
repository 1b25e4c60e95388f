# Session 52, run 4 (H2D sources of 64 KiB or more read through torch's non-owning view,
# the driver asked whether each is page-locked instead of torch's is_pinned()): every GPU
# test binary, the Python suite, then benches/probes/images_split.py (compare run 3).
cd "$(dirname "$0")/../../.."
bash .gpu/run-tests > $OUT/run-tests.txt 2>&1; echo "run-tests rc=$?"; grep -E "^test binaries|FAILED|panicked" $OUT/run-tests.txt | head
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -5
timeout 100 bash .gpu/with-python python3 benches/probes/images_split.py > $OUT/images_split.txt 2>&1; echo "images_split rc=$?"; cat $OUT/images_split.txt
