# Experimental build only (session 50): the binding's marks inside one d2h_one call.
import statistics, time, torch, pinlane
from pinlane import _native
h = torch.arange(256, dtype=torch.float32); d = h.cuda(); torch.cuda.synchronize()
assert torch.equal(pinlane.transfer_tensor_d2h(d), h)
for rnd in range(3):
    marks, eng, whole = {}, {}, []
    for i in range(3000):
        _native.probe_marks(); _native.trace_next_call()
        t0 = time.perf_counter(); _native.d2h_one(d, None); t1 = time.perf_counter()
        m = _native.probe_marks(); e = _native.last_trace() or []
        if i < 300: continue
        whole.append((t1 - t0) * 1e6)
        base = dict(m)
        for k, v in m: marks.setdefault(k, []).append(v)
        for k, v in e: eng.setdefault(k, []).append(base["engine_call"] + v)
    print(f"round {rnd}: whole {statistics.median(whole):.2f} us")
    rows = [(statistics.median(v), k, "binding") for k, v in marks.items()] + [(statistics.median(v), k, "engine") for k, v in eng.items()]
    for at, k, who in sorted(rows):
        print(f"   {who:8s} {k:20s} {at:6.2f}")
    ref = statistics.median([0]*1)
for name, fn in [("d.cpu()", lambda: d.cpu()), ("check_device", lambda: _native.check_device("cuda:0")), ("d2h_one cpu", lambda: _native.d2h_one(h, None))]:
    v=[]
    for i in range(3000):
        t0=time.perf_counter(); fn(); v.append(time.perf_counter()-t0)
    print(f"{name:15s} {statistics.median(v[300:])*1e6:.2f} us")
