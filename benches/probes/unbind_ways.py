"""Probe (session 51): what making a D2H call's 1000 small outputs costs, by way.

A D2H batch of 1000 x 1 KiB is handed to torch as one strided tensor and split with
`unbind(0)` (python/src/torch.rs, `export_with`): about half of the call (session 50,
run 4: 505 us of 1,150). This times ways of splitting one page-locked CPU tensor of
1000 rows into 1000 tensors, with the drop of the outputs apart, and says what the
outputs of each way are (a view? an inference tensor? can they be written in place and
made to require grad, as `t.cpu()`'s can?), so that a cheaper way is taken only if its
outputs behave as the current ones do.

    bash .gpu/with-python python3 benches/probes/unbind_ways.py   # on the GPU machine

Also the per-tensor checks of the inputs (the `is_neg` and `requires_grad` maps) and
the process's speed (a pure-Python loop), as in spdl_compare.py.
"""

import contextlib
import statistics
import time

import torch


def speed():
    t0 = time.perf_counter()
    s = 0
    for i in range(20_000):
        s += i
    return (time.perf_counter() - t0) * 1e6


def timed(make, base, rounds=7, n=30):
    made, dropped = [], []
    for _ in range(rounds):
        for _ in range(n):
            t0 = time.perf_counter()
            out = make(base)
            t1 = time.perf_counter()
            del out
            t2 = time.perf_counter()
            made.append(t1 - t0)
            dropped.append(t2 - t1)
    return statistics.median(made) * 1e6, statistics.median(dropped) * 1e6


def guarded(guard):
    def make(base):
        with guard():
            return base.unbind(0)

    return make


def describe(make, base):
    out = make(base)
    o = out[0]
    facts = {
        "type": type(out).__name__,
        "view": o._is_view(),
        "inference": o.is_inference(),
        "pinned": o.is_pinned(),
        "same storage": o.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(),
    }
    try:
        o.add_(0)
        facts["in-place"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported, the probe's point
        facts["in-place"] = type(e).__name__
    try:
        x = out[1].requires_grad_()
        (x * 2).sum().backward()
        facts["grad"] = "ok" if x.grad is not None else "no grad"
    except Exception as e:  # noqa: BLE001
        facts["grad"] = type(e).__name__
    return facts


def main():
    print(f"torch {torch.__version__}; process speed (20k additions) {speed():.0f} us", flush=True)
    base = torch.empty((1000, 256), dtype=torch.float32, pin_memory=True).fill_(1.0)
    ways = {
        "unbind(0)": lambda b: b.unbind(0),
        "unbind(0), no_grad": guarded(torch.no_grad),
        "unbind(0), inference_mode": guarded(torch.inference_mode),
    }
    below = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", None)
    if below is not None:
        ways["unbind(0), below ADInplaceOrView"] = guarded(below)
    below_ag = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
    if below_ag is not None:
        ways["unbind(0), below Autograd"] = guarded(below_ag)
    ways["split(1)"] = lambda b: b.split(1)
    ways["u8 rows unbind(0)"] = None
    u8 = base.view(torch.uint8)
    for name, make in ways.items():
        b = base
        if make is None:
            make, b = (lambda x: x.unbind(0)), u8
        try:
            facts = describe(make, b)
            made, dropped = timed(make, b)
        except Exception as e:  # noqa: BLE001
            print(f"{name:34s}: failed: {type(e).__name__}: {e}", flush=True)
            continue
        print(f"{name:34s}: make {made:7.1f} us, drop {dropped:7.1f} us; {facts}", flush=True)
    dev = torch.device("cuda", 0)
    xs = [torch.full((256,), float(i), device=dev) for i in range(1000)]
    checks = {
        "any(map(Tensor.is_neg, xs))": lambda: any(map(torch.Tensor.is_neg, xs)),
        "any(t.requires_grad for t in xs)": lambda: any(t.requires_grad for t in xs),
        "any(map(attrgetter requires_grad))": None,
    }
    import operator

    rg = operator.attrgetter("requires_grad")
    checks["any(map(attrgetter requires_grad))"] = lambda: any(map(rg, xs))
    for name, f in checks.items():
        v = []
        for _ in range(200):
            t0 = time.perf_counter()
            f()
            v.append(time.perf_counter() - t0)
        print(f"{name:38s}: {statistics.median(v) * 1e6:7.1f} us", flush=True)
    print(f"process speed at the end {speed():.0f} us", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
