# Experimental build only (session 50): the binding's marks inside 1000 x 1 KiB calls.
import statistics, time, torch, pinlane
from pinlane import _native
srcs = [torch.full((256,), float(i)) for i in range(1000)]
on = pinlane.transfer_tensor_h2d(srcs); torch.cuda.synchronize()
def run(name, fn):
    marks, whole = {}, []
    for i in range(60):
        _native.probe_marks()
        t0 = time.perf_counter(); out = fn(); t1 = time.perf_counter()
        del out
        t2 = time.perf_counter()
        m = _native.probe_marks()
        if i < 10: continue
        whole.append(((t1 - t0) * 1e6, (t2 - t1) * 1e6))
        for k, v in m: marks.setdefault(k, []).append(v)
    print(f"{name}: whole {statistics.median(w for w, _ in whole):.1f} us, drop of the outputs {statistics.median(d for _, d in whole):.1f} us")
    for k, v in sorted(marks.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"   {k:20s} {statistics.median(v):8.1f}")
for r in range(2):
    run("h2d 1000 x 1 KiB", lambda: pinlane.transfer_tensor_h2d(srcs))
    run("d2h 1000 x 1 KiB", lambda: pinlane.transfer_tensor_d2h(on))
def med(fn, n=60):
    v = []
    for i in range(n):
        t0 = time.perf_counter(); fn(); v.append(time.perf_counter() - t0)
    return statistics.median(v[10:]) * 1e6
big = torch.zeros(1000, 256)
T = torch.Tensor
rg = T.requires_grad.__get__
print(f"unbind(0) + drop {med(lambda: big.unbind(0)):.1f} us")
print(f"any(map(Tensor.is_neg, srcs)) {med(lambda: any(map(T.is_neg, srcs))):.1f} us")
print(f"any(map(requires_grad getter, srcs)) {med(lambda: any(map(rg, srcs))):.1f} us")
print(f"[t.requires_grad for t in srcs] {med(lambda: [t.requires_grad for t in srcs]):.1f} us")
print(f"py loop {med(lambda: sum(i & 7 for i in range(20000))):.1f} us")
