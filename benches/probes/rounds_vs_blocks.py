"""Probe (session 52): does timing in rounds (every way a short block of calls in turn, as
the peers bench now times the small batches) change the ways' times, and their ratios,
against timing each way in a block of its own (as the bench did before), in one process?
Session 52's runs timed pinlane's 1000 x 1 KiB at 2.1 to 3.1 ms in rounds, where session
51's fast processes had 1.15 to 1.30 ms in blocks; the other ways moved less.

    bash .gpu/with-python python3 benches/probes/rounds_vs_blocks.py    # on the GPU machine

The two timings alternate, PHASES times each: BLOCKS (each way BLOCK calls in a row, the
ways in a shuffled order, the first WARM calls of each block not timed) and ROUNDS
(ROUND_COUNT rounds, each way IN_ROUND calls in a row, the order shuffled per round).
Batches: 1000 x 1 KiB f32 each way (sources rotated among 4 batches made as the bench
makes them, outputs dropped in the call) and one 1 KiB f32 D2H; ways: pinlane, spdl (when
installed) and torch's per-tensor `.to` / `.cpu()`. Medians over all phases of a kind, us,
and pinlane / each other way.
"""

import random
import statistics
import time

import torch

import pinlane
from pinlane.testing import patterned

PHASES, BLOCK, WARM, ROUND_COUNT, IN_ROUND = 3, 30, 5, 10, 3


def main():
    dev = torch.device("cuda:0")
    srcs = [[patterned(torch.float32, (256,), s * 10000 + i) for i in range(1000)] for s in range(4)]
    on = [[t.to(dev) for t in s] for s in srcs]
    one = [[patterned(torch.float32, (256,), 77 + s).to(dev)] for s in range(8)]
    torch.cuda.synchronize()
    try:
        from spdl.io import transfer_tensor_d2h as spdl_d2h
        from spdl.io import transfer_tensor_h2d as spdl_h2d
    except ImportError:
        spdl_d2h = spdl_h2d = None

    def synced(fn):
        def call(b):
            out = fn(b)
            torch.cuda.synchronize()
            return out
        return call

    cases = {
        "1000 x 1 KiB H2D": (srcs, {
            "pinlane": pinlane.transfer_tensor_h2d,
            "spdl": spdl_h2d,
            "torch .to": synced(lambda b: [t.to(dev) for t in b]),
        }),
        "1000 x 1 KiB D2H": (on, {
            "pinlane": lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0"),
            "spdl": spdl_d2h and (lambda b: spdl_d2h(b, device="cuda:0")),
            "torch .cpu": lambda b: [t.cpu() for t in b],
        }),
        "one 1 KiB D2H": (one, {
            "pinlane": lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0"),
            "torch .cpu": lambda b: [t.cpu() for t in b],
        }),
    }
    rng = random.Random(52)
    for case, (inputs, ways) in cases.items():
        ways = {k: v for k, v in ways.items() if v is not None}
        for name, fn in ways.items():
            got = fn(inputs[0])
            want = srcs[0] if len(inputs[0]) == 1000 else [inputs[0][0].cpu()]
            # Byte for byte: the patterns hold NaNs, which torch.equal calls unequal.
            assert all(torch.equal(g.cpu().view(torch.uint8), w.cpu().view(torch.uint8))
                       for g, w in zip(got, want)), (case, name)
        n = len(inputs)
        turn = [0]

        def call(fn):
            turn[0] += 1
            b = inputs[turn[0] % n]
            t0 = time.perf_counter()
            fn(b)
            return (time.perf_counter() - t0) * 1e6

        got = {kind: {w: [] for w in ways} for kind in ("blocks", "rounds")}
        for _ in range(PHASES):
            order = list(ways)
            rng.shuffle(order)
            for w in order:
                v = [call(ways[w]) for _ in range(BLOCK)]
                got["blocks"][w] += v[WARM:]
            for _ in range(ROUND_COUNT):
                order = list(ways)
                rng.shuffle(order)
                for w in order:
                    got["rounds"][w] += [call(ways[w]) for _ in range(IN_ROUND)]
        print(f"\n{case}: medians over {PHASES} phases of each kind, us (pinlane / the way)")
        print("| way | blocks | rounds | rounds / blocks |")
        print("| --- | ---: | ---: | ---: |")
        med = {k: {w: statistics.median(v) for w, v in d.items()} for k, d in got.items()}
        for w in ways:
            b, r = med["blocks"][w], med["rounds"][w]
            ratio = "" if w == "pinlane" else (f" (x{b / med['blocks']['pinlane']:.2f} / "
                                                f"x{r / med['rounds']['pinlane']:.2f})")
            print(f"| {w}{ratio} | {b:.1f} | {r:.1f} | {r / b:.2f} |")


if __name__ == "__main__":
    main()
