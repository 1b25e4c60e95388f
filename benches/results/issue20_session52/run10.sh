# Session 52, run 10 (the binding asks the driver, not torch's is_pinned(), for imported
# H2D sources too: transfer_tensor_h2d and copy_into never call is_pinned() now; the
# Rust crate as run 9): the Python suite, then benches/probes/large_sources_ab.py.
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -5
timeout 150 bash .gpu/with-python python3 benches/probes/large_sources_ab.py > $OUT/large_sources_ab.txt 2>&1; echo "large_sources_ab rc=$?"; cat $OUT/large_sources_ab.txt
