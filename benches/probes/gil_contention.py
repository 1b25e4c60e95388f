"""Probe (session 47): D2H from Python while another Python thread keeps the interpreter
busy (a pure-Python loop, which holds the GIL until the interpreter asks it to let go,
after `sys.getswitchinterval()`, 5 ms by default). A call that lets go of the GIL for its
copies pays for taking it back; one that takes it back twice (to hand outputs to torch
while its copies run, then at its end) may pay twice. Run once per wheel, in turn:

    PYTHONPATH=/tmp/old python3 benches/probes/gil_contention.py old    # on the GPU machine
    PYTHONPATH=/tmp/site python3 benches/probes/gil_contention.py new

Medians of 20 whole calls (us) for one 1 KiB tensor, 64 x 3x224x224 u8 and a dict of
8 x 32 MiB f32, with no other thread and with the busy one; torch's page-locked way beside.
"""

import statistics
import sys
import threading
import time

import torch

import pinlane

MiB = 1 << 20


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
    tag = sys.argv[1] if len(sys.argv) > 1 else "?"
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(3)
    batches = [
        ("1 x 1 KiB", [torch.rand(256, device=dev, generator=g)]),
        ("64 images", [torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8, device=dev, generator=g)
                       for _ in range(64)]),
        ("8 x 32 MiB", {f"t{i}": torch.rand(8 * MiB, device=dev, generator=g) for i in range(8)}),
    ]

    def pinned(b):
        vals = b.values() if isinstance(b, dict) else b
        out = []
        for t in vals:
            o = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            o.copy_(t, non_blocking=True)
            out.append(o)
        torch.cuda.synchronize()
        return out

    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            for i in range(10000):
                x += i

    for name, b in batches:
        got = pinlane.transfer_tensor_d2h(b, device="cuda:0")
        vals = list(b.values()) if isinstance(b, dict) else b
        outs = list(got.values()) if isinstance(got, dict) else got
        assert all(torch.equal(o, v.cpu()) for o, v in zip(outs, vals)), name
        row = []
        for contended in (False, True):
            th = None
            if contended:
                stop.clear()
                th = threading.Thread(target=busy, daemon=True)
                th.start()
            p = med(lambda: pinlane.transfer_tensor_d2h(b, device="cuda:0"))
            t = med(lambda: pinned(b))
            if th is not None:
                stop.set()
                th.join()
            row.append(f"{'busy thread' if contended else 'alone'}: pinlane {p:9.1f} torch pinned {t:9.1f}")
        print(f"[{tag}] {name:<11} D2H us, " + "; ".join(row))


if __name__ == "__main__":
    main()
