"""Probe (session 51): pinlane's 1000 x 1 KiB calls with and without the split guard,
in one process.

Runs of 16 or more same-shape outputs are split with `unbind(0)` under torch's
`_AutoDispatchBelowADInplaceOrView` where torch has it (python/src/torch.rs, `rows`,
which looks the name up in `torch._C` per run). For "off" this removes that name from
`torch._C` (and puts it back for "on"), so the split makes views as before the guard.

    bash .gpu/with-python python3 benches/probes/split_guard_ab.py   # on the GPU machine

Six rounds, each timing both modes in turn (which goes first alternates), H2D and D2H
of a list of 1000 x 1 KiB f32 tensors, warm sources (the same list each call), the
outputs dropped in the loop as a user's loop drops them: per round and mode the median
whole call (us, 150 calls after 20 of warm-up). Bytes checked once per mode and way;
the process's speed (a pure-Python loop of 20,000 additions) at the start and end.
"""

import statistics
import time

import torch


def loop_us():
    v = []
    for _ in range(21):
        t0 = time.perf_counter()
        x = 0
        for i in range(20000):
            x += i & 7
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def timed(f, n=300, warm=50):
    for _ in range(warm):
        f()
    v = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    import pinlane

    name = "_AutoDispatchBelowADInplaceOrView"
    guard = getattr(torch._C, name)

    def mode(m):
        if m == "on":
            setattr(torch._C, name, guard)
        elif hasattr(torch._C, name):
            delattr(torch._C, name)

    dev = torch.device("cuda", 0)
    host = [torch.full((256,), float(i)) for i in range(1000)]
    gpu = [h.to(dev) for h in host]
    torch.cuda.synchronize(dev)
    for m in ("on", "off"):
        mode(m)
        on = pinlane.transfer_tensor_h2d(host)
        torch.cuda.synchronize(dev)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(on, host))
        back = pinlane.transfer_tensor_d2h(gpu)
        assert all(torch.equal(a, b) for a, b in zip(back, host))
        assert back[0]._is_view() == (m == "off"), m
        del on, back
    print(f"process speed at the start {loop_us():.0f} us", flush=True)
    rows = {"on": [], "off": []}
    for r in range(6):
        for m in (("on", "off") if r % 2 == 0 else ("off", "on")):
            mode(m)
            h2d = timed(lambda: pinlane.transfer_tensor_h2d(host), n=150, warm=20)
            d2h = timed(lambda: pinlane.transfer_tensor_d2h(gpu), n=150, warm=20)
            rows[m].append((h2d, d2h))
            print(f"round {r} guard {m:3s}: 1000 x 1 KiB H2D {h2d:7.1f} us, D2H {d2h:7.1f} us",
                  flush=True)
    mode("on")
    for m, v in rows.items():
        h = statistics.median(x for x, _ in v)
        d = statistics.median(y for _, y in v)
        print(f"guard {m:3s}: median of rounds H2D {h:7.1f} us, D2H {d:7.1f} us", flush=True)
    print(f"process speed at the end {loop_us():.0f} us", flush=True)


if __name__ == "__main__":
    main()
