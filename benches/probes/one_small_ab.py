"""Probe (session 49): small calls from Python against torch's own, for a before/after of
the D2H calls that keep the GIL (`_native` `d2h_held`) and the one-tensor short way of
the public calls, run once per wheel in turn:

    PYTHONPATH=/tmp/old python3 benches/probes/one_small_ab.py old1    # on the GPU machine
    PYTHONPATH=/tmp/site python3 benches/probes/one_small_ab.py new1

Each row: the median over ROUNDS rounds of each round's median of CALLS whole calls (us),
the ways of a row taking turns round by round; outputs dropped inside the timer; every
way's result checked once. D2H: pinlane, torch `.to("cpu")`, torch into a page-locked
tensor (`copy_(non_blocking=True)` and a synchronize). H2D: pinlane, torch `.to("cuda")`
with a synchronize. Then one D2H behind 50 ms of work on torch's current stream
(`torch.cuda._sleep`): the call must wait for it, and let go of the GIL to (the count of
a Python thread's loop iterations meanwhile shows whether it did).
"""

import statistics
import sys
import threading
import time

import torch

import pinlane

ROUNDS, CALLS = 15, 200


def timed(fn):
    v = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def row(name, ways):
    for _, fn in ways:
        for _ in range(50):
            fn()
    got = {w: [] for w, _ in ways}
    for _ in range(ROUNDS):
        for w, fn in ways:
            got[w].append(timed(fn))
    meds = {w: statistics.median(v) for w, v in got.items()}
    best_other = min(v for w, v in meds.items() if w != "pinlane")
    cells = "  ".join(f"{w} {v:7.2f}" for w, v in meds.items())
    print(f"{name:28s} {cells}  fastest other / pinlane {best_other / meds['pinlane']:.3f}x")


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "?"
    print(f"=== {tag} pinlane from {pinlane.__file__}")
    dev = torch.device("cuda", 0)
    h = torch.arange(256, dtype=torch.float32)
    d = h.to(dev)
    pair = {"a": d, "b": (d + 1)}
    dst = torch.empty(256, pin_memory=True)
    torch.cuda.synchronize()
    assert torch.equal(pinlane.transfer_tensor_d2h(d), h)
    assert torch.equal(pinlane.transfer_tensor_h2d(h).cpu(), h)
    out = pinlane.transfer_tensor_d2h(pair)
    assert torch.equal(out["a"], h) and torch.equal(out["b"], h + 1)

    def pinned_d2h():
        dst.copy_(d, non_blocking=True)
        torch.cuda.synchronize()

    row("one 1 KiB D2H", [
        ("pinlane", lambda: pinlane.transfer_tensor_d2h(d)),
        ("torch.to", lambda: d.to("cpu")),
        ("torch_pinned", pinned_d2h),
    ])
    row("dict of 2 x 1 KiB D2H", [
        ("pinlane", lambda: pinlane.transfer_tensor_d2h(pair)),
        ("torch.to", lambda: {k: v.to("cpu") for k, v in pair.items()}),
    ])
    row("one 1 KiB H2D", [
        ("pinlane", lambda: pinlane.transfer_tensor_h2d(h)),
        ("torch.to", lambda: (h.to(dev), torch.cuda.synchronize())),
    ])

    # As the peers bench (pinlane.bench) times its one-tensor rows: a list of one, 8
    # sources taking turns, its own lambdas (pinlane D2H with device="cuda:0").
    from pinlane.bench import ways

    w = ways(torch, dev)
    srcs = [[torch.full((256,), float(i))] for i in range(8)]
    ons = [[s[0].to(dev)] for s in srcs]
    torch.cuda.synchronize()
    k = [0]

    def turn(fn, batches):
        def call():
            k[0] += 1
            return fn(batches[k[0] % 8])
        return call

    names = [n for n in ("pinlane", "torch .to", "torch pinned") if n in w]
    row("bench: [1 KiB] D2H", [(n.replace(" ", ""), turn(w[n][1], ons)) for n in names])
    row("bench: [1 KiB] H2D", [(n.replace(" ", ""), turn(w[n][0], srcs)) for n in names])

    # Behind 50 ms of work on the current stream: right bytes, and the GIL let go meanwhile.
    spins = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            spins[0] += 1

    t = threading.Thread(target=count)
    t.start()
    # 50 ms: the counting thread takes the GIL whenever this one lets go of it, for up to
    # a switch interval (5 ms), so the work must outlast the steps before the call.
    cycles = int(50e-3 * torch.cuda.get_device_properties(dev).clock_rate * 1e3)
    waits, counts = [], []
    for i in range(10):
        x = torch.full((256,), float(i), device=dev)
        torch.cuda._sleep(cycles)
        x.add_(1)  # queued after the sleep: the copy must see it
        before = spins[0]
        t0 = time.perf_counter()
        y = pinlane.transfer_tensor_d2h(x)
        waits.append((time.perf_counter() - t0) * 1e6)
        counts.append(spins[0] - before)
        assert torch.equal(y, torch.full((256,), float(i + 1))), (i, y[:4])
    stop.set()
    t.join()
    print(f"{'one D2H behind 50 ms':28s} call {statistics.median(waits):8.1f} us, "
          f"other thread's iterations in the call {statistics.median(counts):.0f} "
          f"(min {min(counts)}), bytes right")


if __name__ == "__main__":
    main()
