"""Probe (session 48): the flat-batch way (`_native.d2h_flat` / `h2d_flat`, a flat dict,
list or tuple of plain tensors in one native call) against the package before it, run
once per wheel in turn:

    PYTHONPATH=/tmp/old python3 benches/probes/flat_ab.py old1    # on the GPU machine
    PYTHONPATH=/tmp/site python3 benches/probes/flat_ab.py new1

Medians (us) of whole `transfer_tensor_h2d` / `transfer_tensor_d2h` calls, outputs dropped
in the timer, each batch alone in a warm loop: a dict of 8 x 1 KiB, a list of 64 x
3x224x224 u8, a list of 1000 x 1 KiB, a dict of 8 x 32 MiB (H2D from pageable memory;
D2H of the device copies). Every batch's bytes are checked once.
"""

import statistics
import sys
import time

import torch

import pinlane

MiB = 1 << 20


def med(fn, reps):
    for _ in range(5):
        fn()
    v = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "?"
    g = torch.Generator().manual_seed(7)
    batches = [
        ("dict 8 x 1 KiB", {f"k{i}": torch.rand(256, generator=g) for i in range(8)}, 400),
        ("64 images", [torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8, generator=g)
                       for _ in range(64)], 200),
        ("1000 x 1 KiB", [torch.rand(256, generator=g) for _ in range(1000)], 100),
        ("dict 8 x 32 MiB", {f"k{i}": torch.rand(8 * MiB, generator=g) for i in range(8)}, 30),
    ]
    row = []
    for name, host, reps in batches:
        dev = pinlane.transfer_tensor_h2d(host)
        back = pinlane.transfer_tensor_d2h(dev, device="cuda:0")
        vals = (lambda b: list(b.values()) if isinstance(b, dict) else list(b))
        assert all(torch.equal(a, b) for a, b in zip(vals(back), vals(host))), name
        h2d = med(lambda: pinlane.transfer_tensor_h2d(host) and None, reps)
        d2h = med(lambda: pinlane.transfer_tensor_d2h(dev, device="cuda:0") and None, reps)
        row.append(f"{name}: H2D {h2d:8.1f} D2H {d2h:8.1f}")
    print(f"[{tag}] " + "; ".join(row))


if __name__ == "__main__":
    main()
