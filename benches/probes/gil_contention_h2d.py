"""Probe (session 50): small H2D from Python while another Python thread keeps the
interpreter busy (a pure-Python loop, which holds the GIL until the interpreter asks it
to let go, after `sys.getswitchinterval()`, 5 ms by default). gil_contention.py measures
D2H; this asks whether H2D, which lets go of the GIL for its whole engine call, loses to
torch there:

    bash .gpu/with-python python3 benches/probes/gil_contention_h2d.py   # on the GPU machine

Medians of 20 whole calls (us), with no other thread and with the busy one, for one
1 KiB tensor and a list of three: pinlane's H2D; torch's `t.to("cuda")` (ready for work on
the current stream: no synchronisation, what a torch user writes); the same followed by
`torch.cuda.synchronize()` (done, as pinlane's call returns); and torch's page-locked
way (`pin_memory().to(non_blocking=True)`, then a synchronize). pinlane's D2H of one
tensor beside, for reference.
"""

import statistics
import threading
import time

import torch

import pinlane


def med(fn, reps=20):
    for _ in range(3):
        fn()
    v = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    dev = torch.device("cuda:0")
    one = [torch.rand(256)]
    three = [torch.rand(256) for _ in range(3)]
    on = torch.rand(256, device=dev)
    for name, b in (("1 x 1 KiB", one), ("3 x 1 KiB", three)):
        got = pinlane.transfer_tensor_h2d(b)
        assert all(torch.equal(o.cpu(), v) for o, v in zip(got, b)), name
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            for i in range(10000):
                x += i

    for name, b in (("1 x 1 KiB", one), ("3 x 1 KiB", three)):
        ways = [
            ("pinlane h2d", lambda: pinlane.transfer_tensor_h2d(b)),
            ("torch .to", lambda: [t.to(dev) for t in b]),
            ("torch .to + sync", lambda: ([t.to(dev) for t in b], torch.cuda.synchronize())),
            ("torch pinned + sync",
             lambda: ([t.pin_memory().to(dev, non_blocking=True) for t in b], torch.cuda.synchronize())),
            ("pinlane d2h (one tensor)", lambda: pinlane.transfer_tensor_d2h(on)),
        ]
        for contended in (False, True):
            th = None
            if contended:
                stop.clear()
                th = threading.Thread(target=busy, daemon=True)
                th.start()
            row = [f"{w} {med(fn):9.1f}" for w, fn in ways]
            if th is not None:
                stop.set()
                th.join()
            print(f"{name} {'busy thread' if contended else 'alone      '} us: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
