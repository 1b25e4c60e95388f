"""Probe (session 49): where one 1 KiB D2H call's time goes between the interpreter, the
binding and the engine, the pieces taking turns round by round (so that a noisy host
moves them together):

    bash .gpu/with-python python3 benches/probes/one_d2h_split.py     # on the GPU machine

Rows (medians over ROUNDS rounds of each round's median of CALLS calls, us): the public
call, on a bare tensor and as the peers bench calls it (a list of one, `device=`), with
torch's way as that bench calls it beside; the native one-tensor call; the same with a CPU tensor (which D2H passes through:
the interpreter, the argument checks and the input's import, no copy, no output); and
the traced native call with the engine's marks (us from the engine call's start).
"""

import statistics
import time

import torch

import pinlane
from pinlane import _native

ROUNDS, CALLS = 15, 300


def timed(fn):
    v = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    h = torch.arange(256, dtype=torch.float32)
    d = h.cuda()
    torch.cuda.synchronize()
    assert torch.equal(pinlane.transfer_tensor_d2h(d), h)
    from pinlane.bench import _each

    one = [d]
    # Device tensors that pinlane's H2D made (over its own device memory), four taking
    # turns, as the peers bench reads them; and torch-made ones taking turns the same way.
    mine = [[pinlane.transfer_tensor_h2d(h + i)] for i in range(4)]
    theirs = [[(h + i).cuda()] for i in range(4)]
    torch.cuda.synchronize()
    k = [0]

    def turn(batches, fn):
        def call():
            k[0] += 1
            return fn(batches[k[0] % 4])
        return call

    ways = [
        ("public transfer_tensor_d2h(d)", lambda: pinlane.transfer_tensor_d2h(d)),
        ("public, d, device='cuda:0'", lambda: pinlane.transfer_tensor_d2h(d, device="cuda:0")),
        ("public, [d]", lambda: pinlane.transfer_tensor_d2h(one)),
        ("public, [d], device='cuda:0' (the peers bench)",
         lambda: pinlane.transfer_tensor_d2h(one, device="cuda:0")),
        ("torch as the peers bench: [t.cpu() for t in [d]]", lambda: _each(one, lambda t: t.cpu())),
        ("public, 4 lists of one in turn, torch-made", turn(theirs, lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0"))),
        ("public, 4 lists of one in turn, pinlane-made", turn(mine, lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0"))),
        ("torch as the bench, 4 in turn, torch-made", turn(theirs, lambda b: _each(b, lambda t: t.cpu()))),
        ("torch as the bench, 4 in turn, pinlane-made", turn(mine, lambda b: _each(b, lambda t: t.cpu()))),
        ("native d2h_one(d)", lambda: _native.d2h_one(d, None)),
        ("native d2h_one(cpu tensor): pass-through", lambda: _native.d2h_one(h, None)),
        ("native torch_current_stream(d, 0) (session 50)", lambda: _native.torch_current_stream(d, 0)),
        ("native check_device('cuda:0') (session 50)", lambda: _native.check_device("cuda:0")),
        ("torch d.cpu()", lambda: d.cpu()),
    ]
    for _, fn in ways:
        for _ in range(100):
            fn()
    got = {n: [] for n, _ in ways}
    marks = {}
    whole = []
    for _ in range(ROUNDS):
        for n, fn in ways:
            got[n].append(timed(fn))
        for _ in range(CALLS):
            _native.trace_next_call()
            t0 = time.perf_counter()
            _native.d2h_one(d, None)
            whole.append((time.perf_counter() - t0) * 1e6)
            for name, at in _native.last_trace() or []:
                marks.setdefault(name, []).append(at)
    for n, v in got.items():
        print(f"{n:45s} {statistics.median(v):8.2f} us")
    print(f"{'traced native d2h_one(d), whole':45s} {statistics.median(whole):8.2f} us")
    for name, v in marks.items():
        print(f"  engine mark {name!r:30s} {statistics.median(v):8.2f} us from its start ({len(v)} seen)")


if __name__ == "__main__":
    main()
