# Session 51, run 6 (review fixes: no split guard while a torch function mode is active;
# the autograd test covers the in-flight handover and checks that the rows are one run;
# a new test for a function mode during the split): the two tests alone, then the
# Python suite.
cd "$(dirname "$0")/../../.."
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py -k "independent_tensors_to_autograd or function_mode_sees_autograd" > $OUT/new_tests.log 2>&1; tail -1 $OUT/new_tests.log; grep -E "FAILED|Error" $OUT/new_tests.log | head -5
timeout 200 bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "FAILED|Error" $OUT/pytest.log | head -5
