"""Probe (session 70): the binding's own phases of one 1 KiB D2H call (`d2h_one`, the
Python half's short way), beside the engine's marks, and torch's `d.cpu()` in the same
rounds:

    bash .gpu/with-python python3 benches/probes/one_d2h_phases.py     # on the GPU machine

Each round: CALLS untimed-by-phase calls of each way (median, us), then CALLS traced
native calls whose binding marks (`_native.last_split()`: us from the native entry) and
engine marks (`_native.last_trace()`: us from the engine call's start) are collected.
Printed: medians over all traced calls of each mark, and the medians of the step from
the previous mark (the phase's own time).
"""

import statistics
import sys
import time

import torch

import pinlane
from pinlane import _native

ROUNDS, CALLS = 10, 300


def timed(fn):
    v = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    h = torch.arange(256, dtype=torch.float32)
    d = h.cuda()
    torch.cuda.synchronize()
    assert torch.equal(pinlane.transfer_tensor_d2h(d), h)
    assert torch.equal(_native.d2h_one(d, None), h)
    ways = [
        ("public transfer_tensor_d2h(d)", lambda: pinlane.transfer_tensor_d2h(d)),
        ("native d2h_one(d)", lambda: _native.d2h_one(d, None)),
        ("native d2h_one(cpu tensor): pass-through", lambda: _native.d2h_one(h, None)),
        ("torch d.cpu()", lambda: d.cpu()),
    ]
    for _, fn in ways:
        for _ in range(200):
            fn()
    got = {n: [] for n, _ in ways}
    split, steps, engine, whole = {}, {}, {}, []
    for _ in range(ROUNDS):
        for n, fn in ways:
            got[n].append(timed(fn))
        for _ in range(CALLS):
            _native.trace_next_call()
            t0 = time.perf_counter()
            _native.d2h_one(d, None)
            whole.append((time.perf_counter() - t0) * 1e6)
            prev = 0.0
            for name, at in _native.last_split() or []:
                split.setdefault(name, []).append(at)
                steps.setdefault(name, []).append(at - prev)
                prev = at
            for name, at in _native.last_trace() or []:
                engine.setdefault(name, []).append(at)
    print(f"=== {label}")
    for n, v in got.items():
        print(f"{n:45s} {statistics.median(v):8.2f} us (rounds {min(v):.2f} to {max(v):.2f})")
    print(f"{'traced native d2h_one(d), whole':45s} {statistics.median(whole):8.2f} us")
    for name, v in split.items():
        print(f"  binding mark {name!r:22s} at {statistics.median(v):8.2f} us, "
              f"its step {statistics.median(steps[name]):6.2f} ({len(v)} seen)")
    for name, v in engine.items():
        print(f"  engine mark {name!r:23s} at {statistics.median(v):8.2f} us from the engine's start")


if __name__ == "__main__":
    main()
