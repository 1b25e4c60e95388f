# Session 52, run 11 (the final binding: H2D sources of 1 MiB or more, and copy_into's of
# 64 KiB or more, imported as before and asked of the driver, not torch's is_pinned(); the
# run-4 view path for large pageable sources taken out again; the Rust crate as run 9):
# the Python suite.
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -5
