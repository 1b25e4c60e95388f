set -x
bash .gpu/run-tests > $OUT/run-tests.log 2>&1; tail -3 $OUT/run-tests.log
bash .gpu/with-python python3 benches/probes/held_after_stream.py > $OUT/probe.log 2>&1; tail -c 3000 $OUT/probe.log
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -15 $OUT/pytest.log
