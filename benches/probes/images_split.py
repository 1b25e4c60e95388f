"""Probe (session 52): where the Python package's 64 x 3x224x224 u8 calls spend the time
that the Rust bench does not (session 52, run 1: H2D 485 / 489 us from Python against the
Rust bench's 267, D2H 339 / 274 against 219).

    bash .gpu/with-python python3 benches/probes/images_split.py     # on the GPU machine
    .gpu/bin/bench-transfer --trace --only 3x224                     # the Rust marks beside

In one process, sources rotated among 4 batches as the peers bench makes them
(`pinlane.testing.patterned`), outputs dropped in the call. The ways take turns round by
round (ROUNDS rounds, each way CALLS calls in a row, order shuffled per round); medians,
us:

* the public call (`transfer_tensor_h2d(imgs)` / `transfer_tensor_d2h(imgs,
  device="cuda:0")`);
* the native call (`_native.h2d` / `_native.d2h`, told no input is negated);
* the native call with outputs held past the timer, and their drop alone;
* H2D: the native call with every source imported the usual way (`views=False`: a
  managed import per source, where the public call reads these sources, under 1 MiB,
  through torch's non-owning view, as it did before session 52 too);
* the engine's part of the public call: its trace's last mark (from the engine call's
  start to the copies done), and each phase's median (as `bench-transfer --trace`);
  from session 53, the binding's own phases of the same traced calls (`_native.last_split`:
  each phase's median, from the previous mark).
* H2D only: the same batch from sources made with `torch.empty(...).copy_()` (a second
  allocator pattern) and from one 9.6 MB tensor's rows (`unbind(0)`), to see whether the
  sources' memory matters.
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
    shape = (3, 224, 224)
    srcs = [[patterned(torch.uint8, shape, s * 100 + i) for i in range(64)] for s in range(4)]
    fresh = [[torch.empty(shape, dtype=torch.uint8).copy_(t) for t in s] for s in srcs]
    rows = [list(torch.stack(s).unbind(0)) for s in srcs]
    on = [[t.to(dev) for t in s] for s in srcs]
    torch.cuda.synchronize()
    got = pinlane.transfer_tensor_h2d(srcs[0])
    assert all(torch.equal(g.cpu(), s) for g, s in zip(got, srcs[0]))
    back = pinlane.transfer_tensor_d2h(on[0], device="cuda:0")
    assert all(torch.equal(b, s) for b, s in zip(back, srcs[0]))
    del got, back
    k = [0]

    def turn(batches, fn):
        def call():
            k[0] += 1
            return fn(batches[k[0] % 4])
        return call

    held = []

    ways = {
        "H2D public": turn(srcs, pinlane.transfer_tensor_h2d),
        "H2D native": turn(srcs, lambda b: _native.h2d(b, num_caches=4, maybe_neg=False)),
        "H2D native, outputs held": turn(srcs, lambda b: held.append(_native.h2d(b, num_caches=4, maybe_neg=False))),
        # Every source imported the usual way (a managed import each; these sources, under
        # 1 MiB, are not asked torch's `is_pinned()` either way).
        "H2D native, no views": turn(srcs, lambda b: _native.h2d(b, num_caches=4, maybe_neg=False, views=False)),
        "H2D public, sources torch.empty().copy_()": turn(fresh, pinlane.transfer_tensor_h2d),
        "H2D public, sources rows of one tensor": turn(rows, pinlane.transfer_tensor_h2d),
        "D2H public": turn(on, lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0")),
        "D2H native": turn(on, lambda b: _native.d2h(b, device="cuda:0", maybe_neg=False)),
        "D2H native, outputs held": turn(on, lambda b: held.append(_native.d2h(b, device="cuda:0", maybe_neg=False))),
    }
    times = {w: [] for w in ways}
    drops = {w: [] for w in ways if "held" in w}
    marks = {"H2D": [], "D2H": []}
    splits = {"H2D": [], "D2H": []}
    last_split = getattr(_native, "last_split", lambda: None)
    rng = random.Random(52)
    for r in range(ROUNDS + 2):
        order = list(ways)
        rng.shuffle(order)
        for w in order:
            fn = ways[w]
            for _ in range(CALLS):
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                if held:
                    t1 = time.perf_counter()
                    held.clear()
                    d = time.perf_counter() - t1
                    if r >= 2:
                        drops[w].append(d * 1e6)
                if r >= 2:
                    times[w].append(dt * 1e6)
        # Traced public calls, one each way per round (their own rows).
        for direction, fn in (("H2D", ways["H2D public"]), ("D2H", ways["D2H public"])):
            _native.trace_next_call()
            fn()
            m = _native.last_trace()
            b = last_split()
            if m and r >= 2:
                marks[direction].append(m)
            if b and r >= 2:
                splits[direction].append(b)
    print(f"64 x 3x224x224 u8, one process, ways in rounds ({ROUNDS} rounds x {CALLS} calls), medians, us")
    print("| way | call | drop of the held outputs |")
    print("| --- | ---: | ---: |")
    for w, v in times.items():
        d = f"{statistics.median(drops[w]):.1f}" if w in drops else "-"
        print(f"| {w} | {statistics.median(v):.1f} | {d} |")
    for direction, runs in marks.items():
        if not runs:
            print(f"{direction}: no trace")
            continue
        first = runs[0]
        same = [m for m in runs if [n for n, _ in m] == [n for n, _ in first]]
        phases = []
        for j, (name, _) in enumerate(first):
            d = statistics.median(m[j][1] - (m[j - 1][1] if j else 0.0) for m in same)
            phases.append(f"{name} +{d:.1f}")
        total = statistics.median(m[-1][1] for m in same)
        print(f"{direction} public call's engine part (traced, {len(same)} calls): ends at {total:.1f} us; "
              + ", ".join(phases))
    for direction, runs in splits.items():
        if not runs:
            continue
        first = runs[0]
        same = [m for m in runs if [n for n, _ in m] == [n for n, _ in first]]
        phases = [f"{name} +{statistics.median(m[j][1] - (m[j - 1][1] if j else 0.0) for m in same):.1f}"
                  for j, (name, _) in enumerate(first)]
        print(f"{direction} public call's binding phases (traced, {len(same)} calls): " + ", ".join(phases))


if __name__ == "__main__":
    main()
