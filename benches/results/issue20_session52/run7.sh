# Session 52, run 7 (the write-up commit: the package as 269a47c, the new GPU test of
# host_page_locked): every test binary, the Python suite, and with two GPUs (the 2-GPU
# kind, where lent) the Python suite again with LOCAL_RANK=1 (outputs on cuda:1).
cd "$(dirname "$0")/../../.."
nvidia-smi -L
bash .gpu/run-tests > $OUT/run-tests.txt 2>&1; echo "run-tests rc=$?"; grep -E "^test binaries|FAILED|panicked" $OUT/run-tests.txt | head
grep -E "the_driver_tells_page_locked" $OUT/run-tests.txt
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -5
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  LOCAL_RANK=1 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest_rank1.txt 2>&1; echo "pytest LOCAL_RANK=1 rc=$?"; grep -E "passed|failed|Error" $OUT/pytest_rank1.txt | tail -5
fi
