"""Probe (session 54): H2D from Python with its outputs handed to torch while the copies
run (`pinlane.transfer_tensor_h2d_overlapping` in the binding, batches of 1 MiB or more)
against the same call making them after the copies (`_native.h2d(..., handover=False)`),
in one process. Session 55's run 2 ran it on a build that handed over from 512 KiB (not
kept: docs/performance-log.md, session 55), where 1000 x 1 KiB is handed over:

    bash .gpu/with-python python3 benches/probes/h2d_handover_ab.py     # on the GPU machine

Batches (sources rotated among 4, as the peers bench makes them): 64 x 3x224x224 u8
(9.6 MB), 8 x 32 MiB f32, 16 x 64 KiB f32 (1 MiB), 1000 x 1 KiB f32 (1000 KiB: under
1 MiB, a control that must not move; handed over with the 512 KiB build), 500 x 1 KiB f32
(500 KiB, under both: a control that must not move). The two ways take turns
round by round (order shuffled per round, CALLS calls each); medians of whole calls, us.
Then the images and 1000 x 1 KiB both ways while another Python thread keeps the
interpreter busy (a pure-Python loop: the handover takes the GIL back in the call, a
second acquisition that such a thread may delay by a switch interval, 5 ms by default),
and the engine's and the binding's marks of one traced handed-over call of each.
Every way's result is checked once per batch.
"""

import random
import statistics
import sys
import threading
import time

import torch

import pinlane
from pinlane import _native
from pinlane.testing import patterned

ROUNDS, CALLS = 20, 5
MiB = 1 << 20


def batches():
    def four(dtype, shape, n):
        return [[patterned(dtype, shape, s * 10_000 + i) for i in range(n)] for s in range(4)]

    return {
        "64 x 3x224x224 u8": four(torch.uint8, (3, 224, 224), 64),
        "8 x 32 MiB f32": four(torch.float32, (8 * MiB,), 8),
        "16 x 64 KiB f32": four(torch.float32, (16384,), 16),
        "1000 x 1 KiB f32": four(torch.float32, (256,), 1000),
        "500 x 1 KiB f32": four(torch.float32, (256,), 500),
    }


def way(handover):
    return lambda b: _native.h2d(b, num_caches=4, maybe_neg=False, handover=handover)


def check(fn, srcs):
    out = fn(srcs)
    torch.cuda.synchronize()
    assert len(out) == len(srcs)
    # Bytes compared (random f32 bytes hold NaNs, which torch.equal calls unequal).
    assert all(o.is_cuda and torch.equal(o.cpu().view(torch.uint8), s.view(torch.uint8))
               for o, s in zip(out, srcs))


def rounds(ways, srcs, rounds=ROUNDS, calls=CALLS, seed=54):
    times = {w: [] for w in ways}
    rng = random.Random(seed)
    k = 0
    for r in range(rounds + 2):
        order = list(ways)
        rng.shuffle(order)
        for w in order:
            for _ in range(calls):
                k += 1
                b = srcs[k % 4]
                t0 = time.perf_counter()
                ways[w](b)
                dt = time.perf_counter() - t0
                if r >= 2:
                    times[w].append(dt * 1e6)
    return {w: statistics.median(v) for w, v in times.items()}


def main():
    ways = {"after the copies": way(False), "while the copies run": way(True)}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, pinlane {pinlane.__version__}")
    print(f"one process, ways in rounds ({ROUNDS} rounds x {CALLS} calls), medians of whole calls, us")
    print("| batch | after the copies | while the copies run | while / after |")
    print("| --- | ---: | ---: | ---: |")
    all_srcs = batches()
    for name, srcs in all_srcs.items():
        for fn in ways.values():
            check(fn, srcs[0])
        m = rounds(ways, srcs)
        a, w = m["after the copies"], m["while the copies run"]
        print(f"| {name} | {a:.1f} | {w:.1f} | {w / a:.3f} |")
        sys.stdout.flush()
    # Traced: the engine's marks of one handed-over call (the handover between
    # "submitted" and "synced"), and the binding's (from its entry).
    for name in ("64 x 3x224x224 u8", "1000 x 1 KiB f32"):
        _native.trace_next_call()
        way(True)(all_srcs[name][0])
        print(f"{name}, handover=True, engine marks (us):",
              ", ".join(f"{n} {t:.1f}" for n, t in _native.last_trace()))
        print(f"{name}, handover=True, binding marks (us):",
              ", ".join(f"{n} {t:.1f}" for n, t in _native.last_split()))
    # A busy Python thread.
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x += 1

    for name in ("64 x 3x224x224 u8", "1000 x 1 KiB f32"):
        stop.clear()
        t = threading.Thread(target=busy, daemon=True)
        t.start()
        try:
            m = rounds(ways, all_srcs[name], rounds=4, calls=5)
        finally:
            stop.set()
            t.join()
        a, w = m["after the copies"], m["while the copies run"]
        print(f"{name} with a busy Python thread (4 rounds x 5 calls): after {a:.0f} us, "
              f"while {w:.0f} us, while / after {w / a:.3f}")


if __name__ == "__main__":
    main()
