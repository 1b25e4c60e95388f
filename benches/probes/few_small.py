"""Probe (session 46): what a Python call costs for a few small tensors, an inference
server's request (benches/probes/d2h_link.py timed 8 x 1 KiB D2H at 48 us a call, where
one tensor takes 10 to 14).

    bash .gpu/with-python python3 benches/probes/few_small.py     # on the GPU machine

For N = 1, 2, 4, 8, 16 and 32 tensors of 1 KiB (a list), each way timed alone in a warm
loop (median of 300 calls after 30): pinlane's `transfer_tensor_h2d` and
`transfer_tensor_d2h`, torch `t.to("cuda")` per tensor then a synchronize, `t.cpu()` per
tensor. Also D2H of 8 tensors right after an 8 x 32 MiB D2H (as d2h_link.py ran it), to
see whether the large call's release of its outputs is what the small one pays for.
Every way's bytes are checked once.
"""

import statistics
import time

import torch

import pinlane

REPS, WARM = 300, 30


def median_us(fn, reps=REPS):
    for _ in range(WARM):
        fn()
    v = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    dev = torch.device("cuda:0")
    print(f"{'N x 1 KiB':>10} {'pinlane H2D':>12} {'torch .to':>10} {'pinlane D2H':>12} {'torch .cpu':>11}")
    for n in (1, 2, 4, 8, 16, 32):
        host = [torch.randn(256) for _ in range(n)]
        devs = [t.to(dev) for t in host]
        torch.cuda.synchronize()
        up = pinlane.transfer_tensor_h2d(host)
        down = pinlane.transfer_tensor_d2h(devs, device="cuda:0")
        assert all(torch.equal(a.cpu(), b) for a, b in zip(up, host))
        assert all(torch.equal(a, b) for a, b in zip(down, host))

        def to_synced():
            out = [t.to(dev) for t in host]
            torch.cuda.synchronize()
            return out

        row = [
            median_us(lambda: pinlane.transfer_tensor_h2d(host)),
            median_us(to_synced),
            median_us(lambda: pinlane.transfer_tensor_d2h(devs, device="cuda:0")),
            median_us(lambda: [t.cpu() for t in devs]),
        ]
        print(f"{n:>10} " + " ".join(f"{x:>11.1f}" for x in row))

    big = [torch.rand(8 << 20, device=dev) for _ in range(8)]
    small = [torch.rand(256, device=dev) for _ in range(8)]
    torch.cuda.synchronize()
    after, alone = [], []
    for _ in range(40):
        pinlane.transfer_tensor_d2h(big, device="cuda:0")
        t0 = time.perf_counter()
        pinlane.transfer_tensor_d2h(small, device="cuda:0")
        after.append(time.perf_counter() - t0)
    for _ in range(40):
        t0 = time.perf_counter()
        pinlane.transfer_tensor_d2h(small, device="cuda:0")
        alone.append(time.perf_counter() - t0)
    print(f"8 x 1 KiB D2H right after an 8 x 32 MiB D2H: {statistics.median(after) * 1e6:.1f} us; "
          f"alone, one after another: {statistics.median(alone) * 1e6:.1f} us (median of 40)")


if __name__ == "__main__":
    main()
