"""Probe (session 48): where a D2H call waits for the GIL while another Python thread
keeps the interpreter busy. `gil_contention.py` (session 47's) found whole calls of
pinlane taking 5.2 ms for one tensor (one switch interval: the one release around the
copies) but 75 to 203 ms for 64 images and 18 to 49 ms for 8 x 32 MiB, as if the call let
go of the GIL many times. This times the pieces of such a call apart, alone and with the
busy thread (medians, us), to find which piece lets go of it:

* public: `pinlane.transfer_tensor_d2h` of the list, outputs dropped in the timer;
* native: `_native.d2h` of the list, outputs dropped after the timer;
* drop: dropping those outputs alone;
* pass-through: `_native.d2h` of host copies of the tensors (imported, nothing copied, the
  GIL never let go of by pinlane);
* unbind: torch's `unbind(0)` of a page-locked tensor of the batch's shape (how pinlane
  hands a run of same-shape outputs to torch), views dropped in the timer;
* empty pinned: `torch.empty(..., pin_memory=True)` of one output's shape.

    bash .gpu/with-python python3 benches/probes/gil_pieces.py     # on the GPU machine
"""

import statistics
import sys
import threading
import time

import torch

import pinlane
from pinlane import _native

MiB = 1 << 20


def med(fn, reps=15):
    """Median us of `fn()`; its result is dropped outside the timer."""
    v = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        r = fn()
        t1 = time.perf_counter()
        del r
        if i >= 2:
            v.append(t1 - t0)
    return statistics.median(v) * 1e6


def med_drop(make, reps=15):
    """Median us of dropping what `make()` returns (made outside the timer)."""
    v = []
    for i in range(reps + 2):
        r = make()
        t0 = time.perf_counter()
        del r
        t1 = time.perf_counter()
        if i >= 2:
            v.append(t1 - t0)
    return statistics.median(v) * 1e6


def main():
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(5)
    batches = [
        ("1 x 1 KiB", [torch.rand(256, device=dev, generator=g)]),
        ("64 images", [torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8, device=dev, generator=g)
                       for _ in range(64)]),
        ("8 x 32 MiB", [torch.rand(8 * MiB, device=dev, generator=g) for _ in range(8)]),
    ]
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            for i in range(10000):
                x += i

    print(f"switch interval {sys.getswitchinterval() * 1e3:.1f} ms; medians of 15, us")
    for name, b in batches:
        host = [t.cpu() for t in b]
        block = torch.empty((len(b),) + tuple(b[0].shape), dtype=b[0].dtype, pin_memory=True)

        def native():
            return _native.d2h(b, device="cuda:0", maybe_neg=False)

        pieces = [
            ("public", lambda: pinlane.transfer_tensor_d2h(b, device="cuda:0") and None),
            ("native", native),
            ("drop", None),
            ("pass-through", lambda: _native.d2h(host, device="cuda:0", maybe_neg=False)),
            ("unbind", lambda: block.unbind(0) and None),
            ("empty pinned", lambda: torch.empty(b[0].shape, dtype=b[0].dtype, pin_memory=True)),
        ]
        got = pinlane.transfer_tensor_d2h(b, device="cuda:0")
        assert all(torch.equal(o, h) for o, h in zip(got, host)), name
        del got
        for contended in (False, True):
            th = None
            if contended:
                stop.clear()
                th = threading.Thread(target=busy, daemon=True)
                th.start()
            row = []
            for piece, fn in pieces:
                row.append((piece, med_drop(native) if fn is None else med(fn)))
            if th is not None:
                stop.set()
                th.join()
            print(f"{name:<11} {'busy thread' if contended else 'alone':<11} "
                  + "  ".join(f"{p} {us:9.1f}" for p, us in row))


if __name__ == "__main__":
    main()
