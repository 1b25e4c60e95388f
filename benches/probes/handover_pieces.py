"""Probe (session 55): what torch's pieces of the images' H2D handover cost alone, in a
warm loop, for a device run and a host one of the same shape: the split of a
[64, 3, 224, 224] u8 tensor into its rows (`unbind(0)`, plain and under the
`_AutoDispatchBelowADInplaceOrView` guard the binding uses), the mode-stack reads the
binding makes before a run's split, and a DLPack round trip of the run's tensor
(`torch.from_dlpack(t.__dlpack__())`, which costs more than the binding's exchange-API
import, an upper bound for it). Medians of 200 timed repetitions after 50, us.

    bash .gpu/with-python python3 benches/probes/handover_pieces.py
"""

import statistics
import time

import torch

REPS, WARM = 200, 50


def timed(fn):
    for _ in range(WARM):
        fn()
    v = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        v.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(v)


def main():
    c = torch._C
    guard = getattr(c, "_AutoDispatchBelowADInplaceOrView", None)

    def under_guard(t):
        g = guard()
        g.__enter__()
        try:
            return t.unbind(0)
        finally:
            g.__exit__(None, None, None)

    rows = {}
    for where in ("cuda:0", "cpu"):
        t = torch.empty((64, 3, 224, 224), dtype=torch.uint8, device=where)
        rows[f"{where}: unbind(0)"] = timed(lambda: t.unbind(0))
        if guard is not None:
            rows[f"{where}: unbind(0) under the guard"] = timed(lambda: under_guard(t))
        rows[f"{where}: from_dlpack(__dlpack__())"] = timed(lambda: torch.from_dlpack(t.__dlpack__()))
        rows[f"{where}: one row, t[0]"] = timed(lambda: t[0])
    rows["mode stacks read (function, dispatch)"] = timed(
        lambda: (c._len_torch_function_stack(), c._len_torch_dispatch_stack()))
    torch.cuda.synchronize()
    print("torch's pieces of a 64-row handover, warm loop, medians, us")
    print("| piece | us |")
    print("| --- | ---: |")
    for k, v in rows.items():
        print(f"| {k} | {v:.2f} |")


if __name__ == "__main__":
    main()
