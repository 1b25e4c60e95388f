"""Probe (session 53): where the extra time of pinlane's first 1000 x 1 KiB call after the
process was away goes (session 52's small_rounds_why.py: 0.27 to 0.72 ms more after 15 ms
asleep or spinning, 0.06 to 0.31 after a cache flush, D2H too).

    bash .gpu/with-python python3 benches/probes/idle_split.py    # on the GPU machine

Each round runs every activity below once, in an order shuffled per round; after each,
one pinlane call (sources rotated among 4 batches, outputs dropped in the call) is timed
whole and traced (`_native.trace_next_call`): the engine's span is its last mark, the rest
of the whole call is the binding and torch (the inputs' import, the outputs' tensors, the
Python half). Medians over ROUNDS rounds (us), both directions:

* back to back: right after another pinlane call of the same batch (untimed);
* sleep 15 ms: the process idle;
* sleep, then spin 3 ms: the calling CPU awake again, the device not touched;
* sleep, then a device op: a 4-byte torch kernel and a synchronize (the device and the
  driver's paths awake; pinlane's code not run);
* sleep, then one small pinlane call: a 1 KiB call the same direction (pinlane's code
  and the device awake; the batch's memory not touched);
* sleep, then touch the batch: the sources' and a previous output's bytes read on the CPU
  (their caches warm again; nothing of the device).

Each phase row is the median time from the call's start to the mark (the phases' own
names, as `bench-transfer --trace` prints them).
"""

import random
import statistics
import time

import torch

import pinlane
from pinlane import _native

ROUNDS, N, SETS = 40, 1000, 4


def main():
    dev = torch.device("cuda:0")
    srcs = [[torch.randn(256) for _ in range(N)] for _ in range(SETS)]
    on = [[t.to(dev) for t in s] for s in srcs]
    tiny_h, tiny_d = torch.randn(256), torch.randn(256, device=dev)
    poke = torch.zeros(1, device=dev)
    torch.cuda.synchronize()

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    for direction in ("D2H", "H2D"):
        if direction == "D2H":
            call = lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0")  # noqa: E731
            inputs, small = on, (lambda: pinlane.transfer_tensor_d2h([tiny_d], device="cuda:0"))
        else:
            call, inputs, small = pinlane.transfer_tensor_h2d, srcs, (lambda: pinlane.transfer_tensor_h2d([tiny_h]))
        got = call(inputs[0])
        assert all(torch.equal(g.cpu(), s) for g, s in zip(got, srcs[0])), direction
        del got
        turn = [0]

        def next_batch():
            turn[0] += 1
            return inputs[turn[0] % SETS]

        def device_op():
            poke.add_(1)
            torch.cuda.synchronize()

        def touch():
            b = inputs[(turn[0] + 1) % SETS]
            return sum(float(t[0]) for t in b[::8]) + sum(float(t.sum()) for t in srcs[(turn[0] + 1) % SETS][::64])

        acts = {
            "back to back": lambda: call(next_batch()),
            "sleep 15 ms": lambda: time.sleep(0.015),
            "sleep, spin 3 ms": lambda: (time.sleep(0.015), spin(0.003)),
            "sleep, device op": lambda: (time.sleep(0.015), device_op()),
            "sleep, small pinlane call": lambda: (time.sleep(0.015), small()),
            "sleep, touch the batch": lambda: (time.sleep(0.015), touch()),
        }
        whole = {a: [] for a in acts}
        marks = {a: {} for a in acts}
        rng = random.Random(53)
        for r in range(ROUNDS + 2):
            order = list(acts)
            rng.shuffle(order)
            for a in order:
                acts[a]()
                b = next_batch()
                _native.trace_next_call()
                t0 = time.perf_counter()
                call(b)
                dt = time.perf_counter() - t0
                trace = _native.last_trace() or []
                if r >= 2:
                    whole[a].append(dt * 1e6)
                    for m, us in trace:
                        marks[a].setdefault(m, []).append(us)
                    marks[a].setdefault("(engine span)", []).append(trace[-1][1] if trace else float("nan"))
                    marks[a].setdefault("(outside the engine)", []).append(
                        dt * 1e6 - (trace[-1][1] if trace else float("nan")))
        print(f"\n{direction}, 1000 x 1 KiB: pinlane's call after each activity (medians of {ROUNDS} rounds, us)")
        names = list(acts)
        print("| | " + " | ".join(names) + " |")
        print("| --- |" + " ---: |" * len(names))
        print("| whole call | " + " | ".join(f"{statistics.median(whole[a]):.0f}" for a in names) + " |")
        order = list(marks[names[0]])
        for m in order:
            cells = [f"{statistics.median(marks[a][m]):.0f}" if m in marks[a] else "-" for a in names]
            print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
