"""Probe (session 46): why every way that hands out new outputs moves 8 x 32 MiB D2H at
0.94 to 0.97 of the page-locked limit in the peers bench, where the same copies into
page-locked memory allocated once reach 0.997 in the same rounds (benches/spdl_compare.py,
session 46 part 3). Does the copy slow down when its destination changes from call to
call (pinlane's pool handed its two free blocks out in turn), or with much page-locked
memory held by the process?

    bash .gpu/with-python python3 benches/probes/d2h_dest.py      # on the GPU machine

The ways take turns call by call (ROUNDS rounds after WARM), in two phases: as the
process starts, and holding 8 GiB more of page-locked memory (torch, 8 x 1 GiB):

* limit: one 256 MiB copy into a page-locked tensor allocated once;
* same: 8 x 32 MiB `copy_(non_blocking=True)` into 8 page-locked tensors allocated once;
* alt 2 / alt 4: the same copies into 2 or 4 such sets of tensors in turn;
* pinlane: `pinlane.transfer_tensor_d2h` (outputs dropped before its next call);
* torch pinned: into `torch.empty(..., pin_memory=True)` per call.

Prints, per way, the median (us) and the median over rounds of the limit's time over the
way's. Every way's bytes are checked once.
"""

import statistics
import time

import torch

import pinlane

WARM, ROUNDS = 4, 30
MiB = 1 << 20


def main():
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(1)
    batch = [torch.rand(8 * MiB, device=dev, generator=g) for _ in range(8)]
    whole = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
    whole_out = torch.empty(256 * MiB, dtype=torch.uint8, pin_memory=True)
    sets = [[torch.empty(8 * MiB, pin_memory=True) for _ in range(8)] for _ in range(4)]
    torch.cuda.synchronize()

    def limit(r):
        whole_out.copy_(whole, non_blocking=True)
        torch.cuda.synchronize()

    def into(k):
        def call(r):
            outs = sets[r % k]
            for o, t in zip(outs, batch):
                o.copy_(t, non_blocking=True)
            torch.cuda.synchronize()
            return outs
        return call

    def torch_pinned(r):
        out = []
        for t in batch:
            o = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            o.copy_(t, non_blocking=True)
            out.append(o)
        torch.cuda.synchronize()
        return out

    def pl(r):
        return pinlane.transfer_tensor_d2h(batch, device="cuda:0")

    ways = [("limit", limit), ("same", into(1)), ("alt 2", into(2)), ("alt 4", into(4)),
            ("pinlane", pl), ("torch pinned", torch_pinned)]
    for name, fn in ways[1:]:
        for r in range(4):
            assert all(torch.equal(a, b.cpu()) for a, b in zip(fn(r), batch)), name

    def phase(title):
        times = {n: [] for n, _ in ways}
        for r in range(WARM + ROUNDS):
            k = r % len(ways)
            for n, fn in ways[k:] + ways[:k]:
                t0 = time.perf_counter()
                fn(r)
                dt = time.perf_counter() - t0
                if r >= WARM:
                    times[n].append(dt)
        lim = times["limit"]
        print(f"{title}: limit {256 * MiB / statistics.median(lim) / 1e9:.2f} GB/s")
        for n, _ in ways:
            ratio = statistics.median(l / x for l, x in zip(lim, times[n]))
            print(f"  {n:<14} median {statistics.median(times[n]) * 1e6:8.1f} us   x limit (per round) {ratio:.3f}")

    phase("as the process starts")
    held = [torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True) for _ in range(8)]
    phase(f"holding {len(held)} GiB more page-locked memory")


if __name__ == "__main__":
    main()
