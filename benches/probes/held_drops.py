"""Probe (session 50): does a held small D2H let another Python thread run, or does the
drop of the previous call's outputs? The GPU test timed `back = transfer_tensor_d2h(xs)`,
whose window also drops the previous outputs (torch tensors over pinlane's page-locked
blocks, freed through their DLPack deleters); it failed in some runs with three tensors.

    bash .gpu/with-python python3 benches/probes/held_drops.py   # on the GPU machine

With another thread spinning in Python, for one and three tensors, five rounds of 21:
the other thread's progress during (a) the call alone, outputs kept; (b) the drop of
the outputs alone; (c) the call and the drop together, as the test timed them; and, for
comparison (added after run 12, not yet run), the drop alone of torch's own outputs:
(d) of `t.cpu()` (pageable), (e) of page-locked copies (`torch.empty(...,
pin_memory=True)` filled with `copy_`); added in session 51: (f) of CPU tensors torch
imported through DLPack (`torch.from_dlpack(t.cpu().__dlpack__())`), (g) of pinlane's H2D
outputs (device tensors). Per way: in how many windows the other thread
ran, and the median window (us).
"""

import statistics
import threading
import time

import torch

import pinlane


def pinned_copy(x):
    out = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    out.copy_(x)
    return out


def dlpack_copy(x):
    # A CPU tensor that torch imported through DLPack (torch's own deleter path, no
    # pinlane memory): does a DLPack import's drop let go of the GIL by itself?
    return torch.from_dlpack(x.cpu().__dlpack__())


def main():
    dev = torch.device("cuda", 0)
    spins = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            spins[0] += 1

    pinlane.transfer_tensor_d2h(torch.zeros(4, device=dev))
    batches = {n: [torch.full((256,), float(n + i), device=dev) for i in range(n)] for n in (1, 3)}
    torch.cuda.synchronize(dev)
    t = threading.Thread(target=count, daemon=True)
    t.start()
    try:
        for n, xs in batches.items():
            arg = xs[0] if n == 1 else xs
            rows = {"call, outputs kept": [], "drop alone": [], "call and drop": []}
            for _ in range(5):
                kept = []
                for _ in range(21):
                    b, t0 = spins[0], time.perf_counter()
                    kept.append(pinlane.transfer_tensor_d2h(arg))
                    rows["call, outputs kept"].append((spins[0] - b, time.perf_counter() - t0))
                for _ in range(21):
                    b, t0 = spins[0], time.perf_counter()
                    kept.pop()
                    rows["drop alone"].append((spins[0] - b, time.perf_counter() - t0))
                back = pinlane.transfer_tensor_d2h(arg)
                for _ in range(21):
                    b, t0 = spins[0], time.perf_counter()
                    back = pinlane.transfer_tensor_d2h(arg)
                    rows["call and drop"].append((spins[0] - b, time.perf_counter() - t0))
                del back
                for way, make in (("torch .cpu() drop", lambda x: x.cpu()),
                                  ("torch pinned drop", pinned_copy),
                                  ("torch dlpack drop", dlpack_copy),
                                  ("pinlane h2d drop", lambda x: pinlane.transfer_tensor_h2d(x.cpu()))):
                    kept = [[make(x) for x in xs] for _ in range(21)]
                    torch.cuda.synchronize(dev)
                    for _ in range(21):
                        b, t0 = spins[0], time.perf_counter()
                        kept.pop()
                        rows.setdefault(way, []).append((spins[0] - b, time.perf_counter() - t0))
            for way, v in rows.items():
                ran = sum(p > 0 for p, _ in v)
                med = statistics.median(d for _, d in v) * 1e6
                print(f"{n} tensor(s), {way:20s}: the other thread ran in {ran:3d} of {len(v)} windows; "
                      f"median window {med:8.1f} us", flush=True)
    finally:
        stop.set()


if __name__ == "__main__":
    main()
