"""Probe (session 81): does importing a peer library slow pinlane's per-tensor calls?
`mix_gc.py`'s process (tensordict and spdl imported, 300,000 objects tracked by the
collector) gave pinlane's 1000 x 1 KiB H2D 1.45 to 1.88 ms in every phase (every way in
turn or pinlane and spdl alone, the collector on, frozen or off), where `many_split.py`'s
process (spdl imported, no tensordict) on the same machine gave 1.30 ms.

One process: pieces timed in rounds (each a block of 5 calls in turn, 20 rounds after 3
warm-up ones, medians, us), then `import MODULE` (argument; `none`: nothing, the
control for the process's drift), then the same rounds again, then once more:

* pinlane's H2D and D2H of 1000 x 1 KiB, outputs dropped in the timer;
* torch's `unbind(0)` of a [1000, 256] CPU tensor under `no_grad` (making 1000 tensors),
  dropped in the timer;
* `t.is_neg()` of 1000 tensors through `map` (the flat walk's check);
* a pure-Python loop (the process's speed).

    bash .gpu/with-python python3 benches/probes/import_cost.py tensordict   # GPU machine
"""

import gc
import importlib
import random
import statistics
import sys
import time

import torch

import pinlane

N, SETS, BLOCK, ROUNDS, WARM = 1000, 4, 5, 20, 3


def py_loop(_):
    x = 0
    for i in range(20000):
        x += i & 7
    return x


def measure(pieces, seed):
    rng = random.Random(seed)
    times = {n: [] for n, _ in pieces}
    for r in range(WARM + ROUNDS):
        order = list(pieces)
        rng.shuffle(order)
        for n, fn in order:
            for k in range(BLOCK):
                t0 = time.perf_counter()
                fn(r * BLOCK + k)
                dt = time.perf_counter() - t0
                if r >= WARM:
                    times[n].append(dt)
    return {n: statistics.median(v) * 1e6 for n, v in times.items()}


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "none"
    dev = torch.device("cuda:0")
    srcs = [[torch.randn(256) for _ in range(N)] for _ in range(SETS)]
    on = [[t.to(dev) for t in s] for s in srcs]
    base = torch.randn(N, 256)
    torch.cuda.synchronize()
    got = pinlane.transfer_tensor_h2d(srcs[1])
    assert all(torch.equal(g.cpu(), s) for g, s in zip(got, srcs[1]))
    back = pinlane.transfer_tensor_d2h(on[1], device="cuda:0")
    assert all(torch.equal(g, s) for g, s in zip(back, srcs[1]))
    del got, back

    def unbind(_):
        with torch.no_grad():
            return base.unbind(0)

    pieces = [
        ("pinlane H2D", lambda i: (pinlane.transfer_tensor_h2d(srcs[i % SETS]), None)[1]),
        ("pinlane D2H", lambda i: (pinlane.transfer_tensor_d2h(on[i % SETS], device="cuda:0"), None)[1]),
        ("torch unbind(0) of 1000 rows", lambda i: (unbind(i), None)[1]),
        ("is_neg of 1000 (map)", lambda i: any(map(torch.Tensor.is_neg, srcs[i % SETS]))),
        ("pure-Python loop", py_loop),
    ]
    stages = [("before", measure(pieces, 1))]
    t0 = time.perf_counter()
    if name != "none":
        importlib.import_module(name)
    took = time.perf_counter() - t0
    gc.collect()
    stages.append((f"after import {name} ({took:.2f} s)", measure(pieces, 2)))
    stages.append(("after, again", measure(pieces, 3)))
    print(f"import {name}; objects tracked {len(gc.get_objects())}; medians, us")
    print(f"  {'piece':<30}" + "".join(f"{s:>34}" for s, _ in stages))
    for n, _ in pieces:
        print(f"  {n:<30}" + "".join(f"{m[n]:34.1f}" for _, m in stages))


if __name__ == "__main__":
    main()
