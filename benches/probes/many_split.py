"""Probe (session 53): where a 1000 x 1 KiB call's time goes outside the engine. Session
53's idle_split.py found the engine's own span (its trace) at 0.10 to 0.16 ms of a 1.6 to
2.6 ms public call, both directions; this splits the rest, in one process:

    bash .gpu/with-python python3 benches/probes/many_split.py    # on the GPU machine

Rows, each a way taking turns with the others (ROUNDS rounds, each way BLOCK calls in a
row per round, the order shuffled per round, as `pinlane.bench.rounds`; sources rotated
among 4 batches; what a way keeps is dropped after its timer), medians of every timed
call (us):

* public call, outputs dropped in the timer (as the peers bench times it);
* public call, outputs kept (dropped after the timer): the difference is dropping them;
* the native flat call (`_native.d2h_flat` / `h2d_flat`, what the public call makes for a
  flat list), kept;
* the native list call told no input is negated (`_native.d2h` / `h2d`, `maybe_neg=False`),
  kept: the flat walk and rebuild are the difference;
* its engine span (the trace's last mark), and the binding's own phases (`_native.last_split`,
  from session 53 on: each phase's median, from the previous mark), of the native flat
  call traced;
* torch: `unbind(0)` of a [1000, 256] tensor under `torch.no_grad()` (what the outputs'
  tensors cost at the least; the binding's split uses a guard a little cheaper), kept;
  and dropping those 1000 rows;
* torch: `t.requires_grad` of every input (the binding asks each);
* a Python list comprehension over the 1000 inputs (the interpreter's floor per tensor);
* spdl's call, outputs dropped in the timer, when spdl is installed (the 10x target's
  denominator, in the same process).
"""

import random
import statistics
import time

import torch

import pinlane
from pinlane import _native

ROUNDS, BLOCK, N, SETS = 20, 3, 1000, 4


def main():
    dev = torch.device("cuda:0")
    srcs = [[torch.randn(256) for _ in range(N)] for _ in range(SETS)]
    on = [[t.to(dev) for t in s] for s in srcs]
    bases = {"D2H": torch.empty(N, 256, pin_memory=True), "H2D": torch.empty(N, 256, device=dev)}
    torch.cuda.synchronize()
    spans = []
    try:
        from spdl.io import transfer_tensor_d2h as spdl_d2h
        from spdl.io import transfer_tensor_h2d as spdl_h2d
    except ImportError:
        spdl_d2h = spdl_h2d = None

    def timed_rounds(ways):
        # name -> seconds of every timed call; fn(r)'s result is held until after the timer.
        rng = random.Random(53)
        times = {n: [] for n, _ in ways}
        for r in range(ROUNDS + 2):
            order = list(ways)
            rng.shuffle(order)
            for n, fn in order:
                for _ in range(BLOCK):
                    t0 = time.perf_counter()
                    held = fn(r)
                    dt = time.perf_counter() - t0
                    del held
                    if r >= 2:
                        times[n].append(dt)
        return times

    for direction in ("D2H", "H2D"):
        inputs = on if direction == "D2H" else srcs
        if direction == "D2H":
            public = lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0")  # noqa: E731
            flat = lambda b: _native.d2h_flat(b, torch.Tensor, "cuda:0")  # noqa: E731
            native = lambda b: _native.d2h(b, device="cuda:0", maybe_neg=False)  # noqa: E731
        else:
            public = pinlane.transfer_tensor_h2d
            flat = lambda b: _native.h2d_flat(b, torch.Tensor, 4)  # noqa: E731
            native = lambda b: _native.h2d(b, device=0, num_caches=4, maybe_neg=False)  # noqa: E731
        for way in (public, flat, native):
            got = way(inputs[1])
            assert all(torch.equal(g.cpu(), s) for g, s in zip(got, srcs[1])), direction
        del got
        base = bases[direction]

        def unbind(r):
            with torch.no_grad():
                return base.unbind(0)

        def drop_rows(r):
            with torch.no_grad():
                rows = base.unbind(0)
            t0 = time.perf_counter()
            del rows
            drop_times.append(time.perf_counter() - t0)

        phases = {}

        def traced(r):
            _native.trace_next_call()
            out = flat(inputs[r % SETS])
            trace = _native.last_trace() or []
            spans.append(trace[-1][1] if trace else float("nan"))
            last_split = getattr(_native, "last_split", lambda: None)
            prev = 0.0
            for m, us in last_split() or []:
                phases.setdefault(m, []).append(us - prev)
                prev = us
            return out

        drop_times = []
        ways = [
            ("public call, outputs dropped in the timer", lambda r: (public(inputs[r % SETS]), None)[1]),
            ("public call, outputs kept", lambda r: public(inputs[r % SETS])),
            ("native flat call, kept", lambda r: flat(inputs[r % SETS])),
            ("native list call (maybe_neg=False), kept", lambda r: native(inputs[r % SETS])),
            ("native flat call traced, kept (phases below)", traced),
            ("torch unbind(0) under no_grad, kept", unbind),
            ("dropping 1000 rows (the del timed inside)", drop_rows),
            ("t.requires_grad of every input", lambda r: [t.requires_grad for t in inputs[r % SETS]]),
            ("a list comprehension over the inputs", lambda r: [t for t in inputs[r % SETS]]),
        ]
        theirs = spdl_h2d if direction == "H2D" else (spdl_d2h and (lambda b: spdl_d2h(b, device="cuda:0")))
        if theirs is not None:
            got = theirs(inputs[1])
            assert all(torch.equal(g.cpu(), s) for g, s in zip(got, srcs[1])), f"spdl {direction}"
            del got
            ways.append(("spdl's call, outputs dropped in the timer", lambda r: (theirs(inputs[r % SETS]), None)[1]))
        got = timed_rounds(ways)
        print(f"\n{direction}, 1000 x 1 KiB (medians, us; {ROUNDS} rounds of {BLOCK} calls)")
        for n, _ in ways:
            med = statistics.median(got[n]) * 1e6
            print(f"  {n:<48} {med:9.1f}")
        print(f"  {'engine span of the traced native call':<48} {statistics.median(spans):9.1f}")
        for m, v in phases.items():
            print(f"  {'  binding phase to ' + repr(m):<48} {statistics.median(v):9.1f}")
        print(f"  {'dropping 1000 rows, the del alone':<48} {statistics.median(drop_times) * 1e6:9.1f}")
        spans.clear()


if __name__ == "__main__":
    main()
