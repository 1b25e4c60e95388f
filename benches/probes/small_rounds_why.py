"""Probe (session 52): why pinlane's 1000 x 1 KiB calls take about twice as long when the
peers bench times them in rounds (every way a block of 3 calls in turn: 2.26 to 2.55 ms in
session 52's run 1, fast processes) as when it timed them way by way (1.15 to 1.26 ms in
session 51's fast processes).

    bash .gpu/with-python python3 benches/probes/small_rounds_why.py    # on the GPU machine

Each round runs every activity below once, in an order shuffled per round, and after
each activity times 3 pinlane calls in a row (sources rotated among 4 batches, outputs
dropped in the call, as the bench does). Medians over ROUNDS rounds of each call of the
three (us), per activity, both directions:

* none: the previous activity's 3 pinlane calls right before (a block, as way by way);
* sleep 15 ms: the process idle (pinlane's threads park; caches stay);
* spin 15 ms: a pure-Python loop (the CPU busy, little memory touched);
* sweep 64 MiB: a CPU read of a 64 MiB tensor (the caches flushed, no allocation);
* torch .cpu() / .to: torch's per-tensor way over the same batch (allocation churn and
  the caches, as the bench's other ways);
* spdl: spdl's call over the same batch, when installed.
"""

import random
import statistics
import time

import torch

import pinlane

ROUNDS, CALLS, N, SETS = 30, 3, 1000, 4


def main():
    dev = torch.device("cuda:0")
    srcs = [[torch.randn(256) for _ in range(N)] for _ in range(SETS)]
    on = [[t.to(dev) for t in s] for s in srcs]
    torch.cuda.synchronize()
    big = torch.ones(16 << 20)  # 64 MiB of f32
    try:
        from spdl.io import transfer_tensor_d2h as spdl_d2h
        from spdl.io import transfer_tensor_h2d as spdl_h2d
    except ImportError:
        spdl_d2h = spdl_h2d = None

    def spin():
        end = time.perf_counter() + 0.015
        while time.perf_counter() < end:
            pass

    for direction in ("D2H", "H2D"):
        if direction == "D2H":
            call = lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0")  # noqa: E731
            inputs = on
            torch_way = lambda b: [t.cpu() for t in b]  # noqa: E731
            spdl_way = spdl_d2h and (lambda b: spdl_d2h(b, device="cuda:0"))
        else:
            call = pinlane.transfer_tensor_h2d
            inputs = srcs

            def torch_way(b):
                out = [t.to(dev) for t in b]
                torch.cuda.synchronize()
                return out

            spdl_way = spdl_h2d
        got = call(inputs[0])
        assert all(torch.equal(g.cpu(), s) for g, s in zip(got, srcs[0])), direction
        del got
        turn = [0]

        def next_batch():
            turn[0] += 1
            return inputs[turn[0] % SETS]

        acts = {
            "none": lambda: None,
            "sleep 15 ms": lambda: time.sleep(0.015),
            "spin 15 ms": spin,
            "sweep 64 MiB": lambda: float(big.sum()),
            "torch per tensor": lambda: torch_way(next_batch()),
        }
        if spdl_way:
            acts["spdl"] = lambda: spdl_way(next_batch())
        times = {a: [[] for _ in range(CALLS)] for a in acts}
        rng = random.Random(52)
        for r in range(ROUNDS + 2):
            order = list(acts)
            rng.shuffle(order)
            for a in order:
                acts[a]()
                for k in range(CALLS):
                    b = next_batch()
                    t0 = time.perf_counter()
                    call(b)
                    dt = time.perf_counter() - t0
                    if r >= 2:
                        times[a][k].append(dt * 1e6)
        print(f"\n{direction}, 1000 x 1 KiB, pinlane's call after each activity (medians of {ROUNDS} rounds, us)")
        print("| after | call 1 | call 2 | call 3 |")
        print("| --- | ---: | ---: | ---: |")
        for a in acts:
            print(f"| {a} | " + " | ".join(f"{statistics.median(v):.0f}" for v in times[a]) + " |")


if __name__ == "__main__":
    main()
