"""Probe (session 47): D2H from Python with the outputs handed to torch while the copies
run (`transfer_tensor_d2h_overlapping` in the binding) against the package before it.
Run once per wheel, in turn, in separate processes (one installed package at a time):

    PYTHONPATH=/tmp/old python3 benches/probes/d2h_handover.py old     # on the GPU machine
    PYTHONPATH=/tmp/new python3 benches/probes/d2h_handover.py new

Medians of whole calls (us), the outputs dropped inside the timed call as the peers bench
does, each batch's bytes checked once, with torch's own way beside for the ratio:

* one 1 KiB tensor (torch: `.cpu()`), 8 x 1 KiB, 64 x 3x224x224 u8 images and 1000 x
  1 KiB f32 (torch: `.cpu()` per tensor), sources rotated among 4 batches;
* a dict of 8 x 32 MiB f32, in rounds with the floor (copies into page-locked tensors
  allocated once) and torch's page-locked way, in an order shuffled per round: the
  fraction of the floor's rate.
"""

import random
import statistics
import sys
import time

import torch

import pinlane

MiB = 1 << 20


def med(fn, reps):
    for r in range(3):
        fn(r)
    v = []
    for r in range(reps):
        t0 = time.perf_counter()
        fn(r)
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "?"
    dev = torch.device("cuda:0")
    g = torch.Generator().manual_seed(5)
    batches = [
        ("1 x 1 KiB", [[torch.rand(256, generator=g)] for _ in range(4)], 400),
        ("8 x 1 KiB", [[torch.rand(256, generator=g) for _ in range(8)] for _ in range(4)], 200),
        ("64 images", [[torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8, generator=g)
                        for _ in range(64)] for _ in range(4)], 60),
        ("1000 x 1 KiB", [[torch.rand(256, generator=g) for _ in range(1000)] for _ in range(4)], 40),
    ]
    print(f"[{tag}] pinlane from {pinlane.__file__}")
    for name, host, reps in batches:
        on = [[t.to(dev) for t in b] for b in host]
        torch.cuda.synchronize()
        got = pinlane.transfer_tensor_d2h(on[0], device="cuda:0")
        assert all(torch.equal(a, b) for a, b in zip(got, host[0])), name
        del got
        if len(host[0]) == 1:
            p = med(lambda r: pinlane.transfer_tensor_d2h(on[r % 4][0], device="cuda:0"), reps)
            t = med(lambda r: on[r % 4][0].cpu(), reps)
        else:
            p = med(lambda r: pinlane.transfer_tensor_d2h(on[r % 4], device="cuda:0"), reps)
            t = med(lambda r: [x.cpu() for x in on[r % 4]], reps)
        print(f"[{tag}] {name:<14} D2H pinlane {p:9.1f} us   torch .cpu() {t:9.1f} us   torch / pinlane {t / p:5.2f}x")

    batch = {f"t{i:04}": torch.rand(8 * MiB, device=dev) for i in range(8)}
    vals = list(batch.values())
    want = [v.cpu() for v in vals]
    fixed = [torch.empty_like(v, device="cpu", pin_memory=True) for v in vals]

    def floor(_):
        for o, v in zip(fixed, vals):
            o.copy_(v, non_blocking=True)
        torch.cuda.synchronize()

    def pinned(_):
        out = {}
        for k, v in batch.items():
            out[k] = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
            out[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        return out

    def pl(_):
        return pinlane.transfer_tensor_d2h(batch, device="cuda:0")

    got = pl(0)
    assert all(torch.equal(got[k], w) for k, w in zip(batch, want))
    del got
    ways = [("floor", floor), ("torch pinned", pinned), ("pinlane", pl)]
    times = {n: [] for n, _ in ways}
    rng = random.Random(11)
    for r in range(4 + 30):
        order = list(ways)
        rng.shuffle(order)
        for n, fn in order:
            t0 = time.perf_counter()
            fn(r)
            if r >= 4:
                times[n].append(time.perf_counter() - t0)
    fl = statistics.median(times["floor"])
    print(f"[{tag}] 8 x 32 MiB dict D2H, 30 rounds: " + ", ".join(
        f"{n} {statistics.median(v) * 1e6:.1f} us ({fl / statistics.median(v):.3f} of the floor)" for n, v in times.items()))


if __name__ == "__main__":
    main()
