"""Where the time of a Python call goes, per tensor, for 1000 x 1 KiB (GPU machine):
the container walk, the torch attribute reads, the native import (tensors the call passes
through), the handover to torch (runs of same-shape outputs as one tensor split with
unbind(0), or one DLPack import per tensor), and the whole calls.

    bash .gpu/with-python python3 benches/py_overhead.py
"""

import statistics
import time

import torch

import pinlane
from pinlane import _native
from pinlane._tree import flatten, rebuild


def us(fn, reps=30):
    fn()
    v = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    n = 1000
    host = [torch.randn(256) for _ in range(n)]
    pinned = [t.pin_memory() for t in host]
    dev = [t.cuda() for t in host]
    torch.cuda.synchronize()
    cur = torch.cuda.current_stream(0).cuda_stream
    base = torch.empty(n, 256)
    rows = [
        ("flatten", lambda: flatten(host, torch.Tensor)),
        ("rebuild", lambda: rebuild(host, torch.Tensor, dev)),
        ("t.requires_grad", lambda: [t.requires_grad for t in host]),
        ("t.is_pinned() pageable", lambda: [t.is_pinned() for t in host]),
        ("t.is_pinned() pinned", lambda: [t.is_pinned() for t in pinned]),
        ("torch.cuda.current_stream", lambda: torch.cuda.current_stream(0).cuda_stream),
        ("native h2d, CUDA inputs (import, pass through)", lambda: _native.h2d(dev, device=0, num_caches=4, consumer_stream=cur)),
        ("native d2h, CPU inputs (import, pass through)", lambda: _native.d2h(host, device="cuda:0")),
        ("native h2d pageable", lambda: _native.h2d(host, device=0, num_caches=4, consumer_stream=cur)),
        ("native h2d pageable, per-tensor handover", lambda: _native.h2d(host, device=0, num_caches=4, consumer_stream=cur, min_run=1 << 30)),
        ("native h2d pinned", lambda: _native.h2d(pinned, device=0, num_caches=4, consumer_stream=cur)),
        ("native d2h", lambda: _native.d2h(dev, device="cuda:0")),
        ("native d2h, per-tensor handover", lambda: _native.d2h(dev, device="cuda:0", min_run=1 << 30)),
        ("torch: a [1000, 256] tensor's unbind(0)", lambda: base.unbind(0)),
        ("pinlane.transfer_tensor_h2d", lambda: pinlane.transfer_tensor_h2d(host)),
        ("pinlane.transfer_tensor_d2h", lambda: pinlane.transfer_tensor_d2h(dev)),
        ("torch to_dlpack + from_dlpack (reference)", lambda: [torch.from_dlpack(torch.utils.dlpack.to_dlpack(t)) for t in dev]),
    ]
    print(f"{'what (1000 tensors of 1 KiB)':<50} {'us':>9} {'us/tensor':>10}")
    for name, fn in rows:
        m = us(fn)
        print(f"{name:<50} {m:>9.1f} {m / n:>10.3f}")


if __name__ == "__main__":
    main()
