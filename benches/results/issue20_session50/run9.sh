# Session 50, run 9 (HEAD, after DeviceAlloc's drop stopped reading the clock where no
# use is lent): every test binary, the Python suite, and what one clock read costs on
# this machine (the clock source, and time.monotonic_ns in a loop against an empty one).
cd "$(dirname "$0")/../../.."
bash .gpu/run-tests > $OUT/run-tests.log 2>&1; tail -1 $OUT/run-tests.log; grep -E "FAILED|panicked" $OUT/run-tests.log | head
bash .gpu/with-python python3 -m pytest -q -p no:cacheprovider python/tests > $OUT/pytest.log 2>&1; tail -1 $OUT/pytest.log; grep -E "FAILED|Error" $OUT/pytest.log | head -5
cat /sys/devices/system/clocksource/clocksource0/current_clocksource /sys/devices/system/clocksource/clocksource0/available_clocksource 2>&1
python3 - <<'PY'
import time
n = 1_000_000
for _ in range(3):
    f = time.monotonic_ns
    t0 = time.perf_counter(); [f() for _ in range(n)]; a = time.perf_counter() - t0
    g = int
    t0 = time.perf_counter(); [g() for _ in range(n)]; b = time.perf_counter() - t0
    print(f"time.monotonic_ns {a / n * 1e9:.1f} ns a call; int() {b / n * 1e9:.1f} ns: a clock read about {(a - b) / n * 1e9:.1f} ns")
PY
