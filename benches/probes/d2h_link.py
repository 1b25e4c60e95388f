"""Probe (session 46): is pinlane's 8 x 32 MiB D2H from Python below the page-locked limit
for a reason of its own, or with the link's drift between blocks of calls?

    bash .gpu/with-python python3 benches/probes/d2h_link.py      # on the GPU machine

The peers bench (benches/spdl_compare.py) times each way in a block of calls and the limit
once, at the start. Here, in one process, the ways take turns call by call (round robin,
ROUNDS rounds after WARM), so every way meets the same link:

* limit: one 256 MiB copy into a page-locked tensor allocated once (the bench's limit);
* torch into preallocated: 8 x 32 MiB `copy_(non_blocking=True)` into page-locked
  tensors allocated once, then `synchronize()`: what the link gives 8 copies;
* torch pinned: the bench's way (`torch.empty(..., pin_memory=True)` per call);
* pinlane: `pinlane.transfer_tensor_d2h`;
* pinlane 8 x 1 KiB: the same call on 8 tensors of 1 KiB (what a call of 8 tensors costs
  besides the copies).

Prints, per way, the median, the 10th and 90th percentiles (us), and the median of the
per-round ratio to the limit's call of the same round (the limit's bytes per second over
the way's), beside the ratio of the medians. Every way's bytes are checked once.
"""

import statistics
import time

import torch

import pinlane

WARM, ROUNDS = 5, 40
MiB = 1 << 20


def main():
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(1)
    batch = [torch.rand(8 * MiB, device=dev, generator=g) for _ in range(8)]
    small = [torch.rand(256, device=dev, generator=g) for _ in range(8)]
    whole = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
    whole_out = torch.empty(256 * MiB, dtype=torch.uint8, pin_memory=True)
    outs = [torch.empty_like(t, device="cpu", pin_memory=True) for t in batch]
    torch.cuda.synchronize()

    def limit():
        whole_out.copy_(whole, non_blocking=True)
        torch.cuda.synchronize()

    def prealloc():
        for o, t in zip(outs, batch):
            o.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        return outs

    def torch_pinned():
        r = []
        for t in batch:
            o = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            o.copy_(t, non_blocking=True)
            r.append(o)
        torch.cuda.synchronize()
        return r

    def pl():
        return pinlane.transfer_tensor_d2h(batch, device="cuda:0")

    def pl_small():
        return pinlane.transfer_tensor_d2h(small, device="cuda:0")

    for name, fn in [("torch into preallocated", prealloc), ("torch pinned", torch_pinned), ("pinlane", pl)]:
        got = fn()
        assert all(torch.equal(a, b.cpu()) for a, b in zip(got, batch)), name
    assert all(torch.equal(a, b.cpu()) for a, b in zip(pl_small(), small))

    ways = [("limit (one 256 MiB copy)", limit), ("torch into preallocated", prealloc),
            ("torch pinned", torch_pinned), ("pinlane", pl), ("pinlane 8 x 1 KiB", pl_small)]
    times = {n: [] for n, _ in ways}
    for r in range(WARM + ROUNDS):
        for n, fn in ways:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r >= WARM:
                times[n].append(dt)
    lim = times[ways[0][0]]
    lim_med = statistics.median(lim)
    print(f"8 x 32 MiB f32 D2H, {ROUNDS} rounds, the ways in turn call by call; limit "
          f"{256 * MiB / lim_med / 1e9:.2f} GB/s (median)")
    print(f"{'way':<28} {'median us':>10} {'p10':>9} {'p90':>9} {'x limit (medians)':>18} {'x limit (per round)':>20}")
    for n, _ in ways:
        v = sorted(times[n])
        med = statistics.median(v)
        p10, p90 = v[len(v) // 10], v[(len(v) * 9) // 10]
        per_round = statistics.median(l / x for l, x in zip(lim, times[n]))
        print(f"{n:<28} {med * 1e6:>10.1f} {p10 * 1e6:>9.1f} {p90 * 1e6:>9.1f} {lim_med / med:>18.3f} {per_round:>20.3f}")


if __name__ == "__main__":
    main()
