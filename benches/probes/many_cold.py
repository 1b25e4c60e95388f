"""Probe (session 47): why a 1000 x 1 KiB call from Python takes 1.8 to 2.7 ms in the peers
bench (benches/spdl_compare.py), where `benches/py_overhead.py`'s warm loop times the same
call at 1.3 to 1.4 ms, and what of it is pinlane's.

    bash .gpu/with-python python3 benches/probes/many_cold.py      # on the GPU machine

For each direction, medians of REPS calls (us) of:

* the whole call as the peers bench makes it (sources rotated among 4 batches, the outputs
  dropped inside the timed call), with the same batch every call (warm), and with the
  interpreter's cyclic garbage collector off (`gc.disable()`);
* the call with its outputs held past the timer, then their drop timed alone;
* the pieces, sources rotated: `flatten`, the negation bits, the native call (outputs
  held), `rebuild`;
* torch's `unbind(0)` of a [1000, 256] tensor on the output side (the handover pinlane
  uses for a run of same-shape outputs), held, and its drop;
* spdl's call (when installed), rotated, for the ratio;
* how many collections the garbage collector made per call, over the rotated whole calls.
"""

import gc
import statistics
import time

import torch

import pinlane
from pinlane import _native
from pinlane._tree import flatten, rebuild

REPS, N, SETS = 40, 1000, 4


def med(fn, reps=REPS, hold=False):
    """Median us of `fn(r)`; with `hold`, the result outlives the timer and its drop is
    timed too: (call, drop)."""
    fn(0)
    fn(1)
    v, d = [], []
    for r in range(reps):
        t0 = time.perf_counter()
        if hold:
            out = fn(r)
            t1 = time.perf_counter()
            del out
            d.append(time.perf_counter() - t1)
            v.append(t1 - t0)
        else:
            fn(r)
            v.append(time.perf_counter() - t0)
    m = statistics.median(v) * 1e6
    return (m, statistics.median(d) * 1e6) if hold else m


def collections(fn, reps=REPS):
    seen = [0]

    def cb(phase, _info):
        if phase == "start":
            seen[0] += 1
    gc.callbacks.append(cb)
    try:
        for r in range(reps):
            fn(r)
    finally:
        gc.callbacks.remove(cb)
    return seen[0] / reps


def main():
    dev = torch.device("cuda:0")
    g = torch.Generator().manual_seed(3)
    host = [[torch.rand(256, generator=g) for _ in range(N)] for _ in range(SETS)]
    device = [[t.to(dev) for t in b] for b in host]
    torch.cuda.synchronize()
    try:
        from spdl.io import transfer_tensor_d2h as spdl_d2h
        from spdl.io import transfer_tensor_h2d as spdl_h2d
    except ImportError:
        spdl_d2h = spdl_h2d = None
    print(f"{N} x 1 KiB f32, {REPS} calls each, sources rotated among {SETS} batches unless warm; us per call")
    for direction, srcs in [("D2H", device), ("H2D", host)]:
        if direction == "D2H":
            def call(b):
                return pinlane.transfer_tensor_d2h(b, device="cuda:0")

            def native(ts):
                return _native.d2h(ts, device="cuda:0", maybe_neg=False)
            side = torch.empty(N, 256, pin_memory=True)
            spdl = spdl_d2h and (lambda b: spdl_d2h(b, device="cuda:0"))
        else:
            call = pinlane.transfer_tensor_h2d

            def native(ts):
                return _native.h2d(ts, num_caches=4, maybe_neg=False)
            side = torch.empty(N, 256, device=dev)
            spdl = spdl_h2d
        got = call(srcs[0])
        assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, srcs[0])), direction
        del got
        rows = [("whole call, rotated (the peers bench's)", med(lambda r: call(srcs[r % SETS]))),
                ("whole call, warm (one batch)", med(lambda r: call(srcs[0])))]
        gc.disable()
        try:
            rows.append(("whole call, rotated, gc off", med(lambda r: call(srcs[r % SETS]))))
        finally:
            gc.enable()
        c, d = med(lambda r: call(srcs[r % SETS]), hold=True)
        rows += [("  the call, outputs held", c), ("  the outputs' drop", d)]
        flat = [flatten(s, torch.Tensor) for s in srcs]
        rows.append(("  flatten", med(lambda r: flatten(srcs[r % SETS], torch.Tensor))))
        rows.append(("  any(map(Tensor.is_neg, ...))", med(lambda r: any(map(torch.Tensor.is_neg, flat[r % SETS])))))
        c, d = med(lambda r: native(flat[r % SETS]), hold=True)
        rows += [("  native call, outputs held", c), ("  its outputs' drop", d)]
        outs = [native(f) for f in flat]
        rows.append(("  rebuild", med(lambda r: rebuild(srcs[r % SETS], torch.Tensor, outs[r % SETS]))))
        del outs
        c, d = med(lambda r: side.unbind(0), hold=True)
        rows += [("torch: unbind(0) of [1000, 256], held", c), ("torch: its views' drop", d)]
        if spdl is not None:
            rows.append(("spdl whole call, rotated", med(lambda r: spdl(srcs[r % SETS]), reps=10)))
        print(f"\n{direction}")
        for name, v in rows:
            print(f"{name:<44} {v:>9.1f}")
        print(f"{'garbage collections per whole call':<44} {collections(lambda r: call(srcs[r % SETS])):>9.2f}")
        print(f"{'gc thresholds, counts':<44} {gc.get_threshold()} {gc.get_count()}")


if __name__ == "__main__":
    main()
