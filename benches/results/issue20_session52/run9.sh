# Session 52, run 9 (the review's fixes: one_buffer_where shared by host_page_locked and
# host_mapped_in_place, the length carried in the binding's view, the route test counting
# torch's is_pinned() calls and covering Buffers): every test binary, the Python suite,
# then benches/probes/large_sources_ab.py (the change against the old way, one process).
cd "$(dirname "$0")/../../.."
bash .gpu/run-tests > $OUT/run-tests.txt 2>&1; echo "run-tests rc=$?"; grep -E "^test binaries|FAILED|panicked" $OUT/run-tests.txt | head
grep -E "the_driver_tells_page_locked|imports_are_read_in_place" $OUT/run-tests.txt
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -5
timeout 150 bash .gpu/with-python python3 benches/probes/large_sources_ab.py > $OUT/large_sources_ab.txt 2>&1; echo "large_sources_ab rc=$?"; cat $OUT/large_sources_ab.txt
