"""Probe (session 52): what asking the driver instead of torch saves, in one process. H2D
sources of 1 MiB or more (`transfer_tensor_h2d`) and of 64 KiB or more (`copy_into`,
`Buffers`) were each imported the managed way and asked torch's `is_pinned()`. In run 9
the code under test read pageable ones through torch's non-owning view and asked the
driver, and the native calls' `views=False` was exactly the old way for batches of only
such sources. In run 10 the managed import asked the driver too, so `views=False` was
the import with the driver's answer. The final code keeps that import (the view showed
no gain there) and asks the driver: with it, both rows below run the same code for these
batches. Both ways take turns here:

    bash .gpu/with-python python3 benches/probes/large_sources_ab.py    # on the GPU machine

Batches: 64 x 1 MiB f32 pageable and page-locked (`_native.h2d`, outputs dropped in the
call); 16 x 512 KiB f32 pageable into a `Buffers` (`copy_from` through its native
targets, then a synchronize). Sources rotated among 4 batches. ROUNDS rounds, each way
CALLS calls in a row, order shuffled per round; medians, us, and old / new.
"""

import random
import statistics
import time

import torch

import pinlane
from pinlane import _native
from pinlane.testing import patterned

ROUNDS, CALLS = 20, 5


def main():
    dev = torch.device("cuda:0")
    mib = 1 << 18
    big = [[patterned(torch.float32, (mib,), s * 100 + i) for i in range(64)] for s in range(4)]
    big_locked = [[t.pin_memory() for t in b] for b in big]
    mid = [[patterned(torch.float32, (mib // 2,), 7000 + s * 100 + i) for i in range(16)] for s in range(4)]
    bufs = pinlane.Buffers([torch.empty(mib // 2, device=dev) for _ in range(16)])
    torch.cuda.synchronize()
    # The bytes, both ways.
    for views in (True, False):
        out = _native.h2d(big[0], num_caches=4, maybe_neg=False, views=views)
        assert all(torch.equal(o.cpu().view(torch.uint8), s.view(torch.uint8)) for o, s in zip(out, big[0]))
        bufs._native.copy_from(mid[0], maybe_neg=False, views=views)
        torch.cuda.synchronize()
        assert all(torch.equal(d.cpu().view(torch.uint8), s.view(torch.uint8))
                   for d, s in zip(bufs._leaves, mid[0]))
    k = [0]

    def turn(batches, fn):
        def call():
            k[0] += 1
            return fn(batches[k[0] % 4])
        return call

    def copy(views):
        def call(b):
            bufs._native.copy_from(b, maybe_neg=False, views=views)
            torch.cuda.synchronize()
        return call

    ways = {}
    for views, tag in ((True, "new (views, driver asked)"), (False, "old (managed imports, is_pinned)")):
        ways[("64 x 1 MiB pageable H2D", tag)] = turn(
            big, lambda b, v=views: _native.h2d(b, num_caches=4, maybe_neg=False, views=v))
        ways[("64 x 1 MiB page-locked H2D", tag)] = turn(
            big_locked, lambda b, v=views: _native.h2d(b, num_caches=4, maybe_neg=False, views=v))
        ways[("16 x 512 KiB pageable into Buffers", tag)] = turn(mid, copy(views))
    times = {w: [] for w in ways}
    rng = random.Random(52)
    for r in range(ROUNDS + 2):
        order = list(ways)
        rng.shuffle(order)
        for w in order:
            for _ in range(CALLS):
                t0 = time.perf_counter()
                ways[w]()
                if r >= 2:
                    times[w].append((time.perf_counter() - t0) * 1e6)
    print(f"one process, ways in rounds ({ROUNDS} rounds x {CALLS} calls), medians, us")
    print("| batch | new | old | old - new | old / new |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for batch in dict.fromkeys(b for b, _ in ways):
        new = statistics.median(times[(batch, "new (views, driver asked)")])
        old = statistics.median(times[(batch, "old (managed imports, is_pinned)")])
        print(f"| {batch} | {new:.1f} | {old:.1f} | {old - new:.1f} | {old / new:.3f} |")


if __name__ == "__main__":
    main()
