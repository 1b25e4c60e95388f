"""Where the time of a Python call goes (GPU machine): for one 1 KiB tensor, each piece of
the call (the Python half's checks and lookups, the native call with and without a copy,
torch's own ways beside it); for a 16-tensor serving step (`Buffers.copy_from`), its
pieces (pairing, the negation bits, the native call with and without the binding's
non-owning views, one source against 16, and `Pairs.copy` with the sources bound) beside
torch's per-tensor `copy_`; for 1000 x 1
KiB, per tensor: the container walk, the torch attribute reads, the native import (tensors
the call passes through), H2D with and without the views, the handover to torch (runs of
same-shape outputs as one tensor split with unbind(0), or one DLPack import per tensor),
and the whole calls. Medians of warm loops, in microseconds.

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


def h2d_as_before(batch):
    """The Python half of transfer_tensor_h2d before issue 20 (pinlane 0.1.0 at 89d6fc0):
    torch.cuda.is_available() on every call, the current stream asked from Python, the
    recursive walk for every batch. For a before/after in one process."""
    if pinlane._native.device_count() == 0 or not torch.cuda.is_available():
        return batch
    out = []
    pinlane._tree._collect(batch, torch.Tensor, out)
    device = _native.default_device()
    consumer = torch.cuda.current_stream(device).cuda_stream
    outs = _native.h2d(out, device=device, num_caches=4, consumer_stream=consumer)
    it = iter(outs)
    return pinlane._tree._rebuild(batch, torch.Tensor, it)


def one_tensor():
    """The pieces of one call with one 1 KiB tensor, each timed alone in a warm loop."""
    t = torch.randn(256)
    d = t.cuda()
    torch.cuda.synchronize()
    cur = torch.cuda.current_stream(0).cuda_stream
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    out = torch.empty(256, pin_memory=True)

    def to_synced():
        t.to("cuda")
        torch.cuda.synchronize()

    def pinned_copy():
        out.copy_(d, non_blocking=True)
        torch.cuda.synchronize()

    rows = [
        ("torch.cuda.is_available()", torch.cuda.is_available),
        ("pinlane._torch_with_cuda()", pinlane._torch_with_cuda),
        ("flatten([t])", lambda: flatten([t], torch.Tensor)),
        ("rebuild([t])", lambda: rebuild([t], torch.Tensor, [d])),
        ("_native.default_device()", _native.default_device),
        ("torch.cuda.current_stream(0).cuda_stream", lambda: torch.cuda.current_stream(0).cuda_stream),
        ("torch._C._cuda_getCurrentRawStream(0)", (lambda: raw(0)) if raw else None),
        ("torch.cuda.synchronize() (idle)", torch.cuda.synchronize),
        ("torch.empty(256, device='cuda')", lambda: torch.empty(256, device="cuda")),
        ("native h2d, a CUDA input (import, pass through)", lambda: _native.h2d([d], device=0, num_caches=4, consumer_stream=cur)),
        ("native d2h, a CPU input (import, pass through)", lambda: _native.d2h([t], device="cuda:0")),
        ("native h2d, current stream passed in", lambda: _native.h2d([t], device=0, num_caches=4, consumer_stream=cur)),
        ("native h2d, current stream asked natively", lambda: _native.h2d([t], device=0, num_caches=4)),
        ("native: torch's current stream (exchange API)", lambda: _native.torch_current_stream(t, 0)),
        ("native d2h", lambda: _native.d2h([d], device="cuda:0")),
        ("native d2h, no negated input (view)", lambda: _native.d2h([d], device="cuda:0", maybe_neg=False)),
        ("native d2h, no negated input, no view", lambda: _native.d2h([d], device="cuda:0", maybe_neg=False, views=False)),
        ("pinlane.transfer_tensor_h2d([t]), Python half as before", lambda: h2d_as_before([t])),
        ("pinlane.transfer_tensor_h2d([t])", lambda: pinlane.transfer_tensor_h2d([t])),
        ("pinlane.transfer_tensor_d2h([d])", lambda: pinlane.transfer_tensor_d2h([d])),
        ("torch: t.to('cuda')", lambda: t.to("cuda")),
        ("torch: t.to('cuda') + synchronize()", to_synced),
        ("torch: d.cpu()", lambda: d.cpu()),
        ("torch: page-locked out.copy_(d) + synchronize()", pinned_copy),
    ]
    print(f"{'what (one 1 KiB tensor)':<50} {'us':>9}")
    for name, fn in rows:
        if fn is None:
            print(f"{name:<50} {'-':>9}")
            continue
        print(f"{name:<50} {us(fn, reps=2000):>9.2f}")
    print()


def traced(fn, reps=2000):
    """Median whole-call time of `fn` (one transfer) and median of the engine's own part
    of it (its last trace mark: from the engine call's start to the copies done), over
    `reps` traced calls."""
    fn()
    whole, engine = [], []
    for _ in range(reps):
        _native.trace_next_call()
        t0 = time.perf_counter()
        fn()
        whole.append(time.perf_counter() - t0)
        marks = _native.last_trace() or [("none", 0.0)]
        engine.append(marks[-1][1])
    return statistics.median(whole) * 1e6, statistics.median(engine)


def small_call_split():
    """One 1 KiB tensor and 64 3x224x224 u8 images, each way: the whole Python call, the native call, and the engine's
    part of the native call (its trace, in this process), so that the Python half and the
    binding (import, checks, output tensors) are the differences. The native calls are
    told that no input is negated, as the Python half tells them after asking."""
    t = torch.randn(256)
    d = t.cuda()
    torch.cuda.synchronize()
    imgs = [torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8) for _ in range(64)]
    dimgs = [x.cuda() for x in imgs]
    torch.cuda.synchronize()
    rows = [
        ("1 KiB H2D", lambda: pinlane.transfer_tensor_h2d([t]), lambda: _native.h2d([t], device=0, num_caches=4, maybe_neg=False)),
        ("1 KiB D2H", lambda: pinlane.transfer_tensor_d2h([d]), lambda: _native.d2h([d], device="cuda:0", maybe_neg=False)),
        ("64 images H2D", lambda: pinlane.transfer_tensor_h2d(imgs), lambda: _native.h2d(imgs, device=0, num_caches=4, maybe_neg=False)),
        ("64 images D2H", lambda: pinlane.transfer_tensor_d2h(dimgs), lambda: _native.d2h(dimgs, device="cuda:0", maybe_neg=False)),
        # The same native calls with every input imported the usual way (before session 32's
        # views for D2H): the binding column's difference is what the views save.
        ("1 KiB D2H, no view", lambda: pinlane.transfer_tensor_d2h([d]), lambda: _native.d2h([d], device="cuda:0", maybe_neg=False, views=False)),
        ("64 images D2H, no views", lambda: pinlane.transfer_tensor_d2h(dimgs), lambda: _native.d2h(dimgs, device="cuda:0", maybe_neg=False, views=False)),
    ]
    print(f"{'a small call, split (us)':<30} {'whole':>8} {'native':>8} {'engine':>8} {'Python half':>12} {'binding':>8}")
    for name, whole_fn, native_fn in rows:
        reps = 2000 if name.startswith("1 KiB") else 300
        whole, _ = traced(whole_fn, reps)
        native, engine = traced(native_fn, reps)
        print(f"{name:<30} {whole:>8.2f} {native:>8.2f} {engine:>8.2f} {whole - native:>12.2f} {native - engine:>8.2f}")
    print()


def serving_step():
    """The pieces of a Buffers step (16 pageable tensors of 256 B to 4 KiB into slices of
    one static buffer, as benches/copy_into.py's smallest config), each timed alone."""
    rng = torch.Generator().manual_seed(7)
    sizes = [int(2 ** (8 + 4 * float(torch.rand(1, generator=rng)))) // 8 * 8 for _ in range(16)]
    src = {f"t{i:02}": torch.randint(0, 1 << 30, (n // 8,), dtype=torch.int64) for i, n in enumerate(sizes)}
    buf = torch.zeros(sum(-(-n // 256) * 256 for n in sizes), dtype=torch.uint8, device="cuda")
    dst, at = {}, 0
    for k, v in src.items():
        dst[k] = buf[at : at + v.nbytes].view(torch.int64)
        at += -(-v.nbytes // 256) * 256
    one = pinlane.Buffers({"t00": dst["t00"]})
    bufs = pinlane.Buffers(dst)
    srcs = bufs._sources(src)
    pairs = pinlane.Pairs(bufs, src)
    one_pair = pinlane.Pairs(one, {"t00": src["t00"]})
    s = torch.cuda.current_stream()

    def synced(fn):
        def run():
            fn()
            s.synchronize()
        return run

    rows = [
        ("Buffers._sources(src) (pairing)", lambda: bufs._sources(src)),
        ("any(map(Tensor.is_neg, srcs))", lambda: any(map(torch.Tensor.is_neg, srcs))),
        ("native copy_from, views + sync", synced(lambda: bufs._native.copy_from(srcs, maybe_neg=False))),
        ("native copy_from, no views + sync", synced(lambda: bufs._native.copy_from(srcs, maybe_neg=False, views=False))),
        ("native copy_from, 1 source, views + sync", synced(lambda: one._native.copy_from(srcs[:1], maybe_neg=False))),
        ("native copy_from, 1 source, no views + sync", synced(lambda: one._native.copy_from(srcs[:1], maybe_neg=False, views=False))),
        ("Buffers.copy_from(src) + sync", synced(lambda: bufs.copy_from(src))),
        ("Pairs.copy() (sources bound) + sync", synced(pairs.copy)),
        ("Pairs.copy(), 1 source + sync", synced(one_pair.copy)),
        ("torch copy_ per tensor + sync", synced(lambda: [dst[k].copy_(v, non_blocking=True) for k, v in src.items()])),
        ("stream.synchronize() (idle)", s.synchronize),
    ]
    print(f"{'what (a 16-tensor serving step)':<50} {'us':>9}")
    for name, fn in rows:
        print(f"{name:<50} {us(fn, reps=2000):>9.2f}")
    print()


def _no_grad(fn, *args):
    with torch.no_grad():
        return fn(*args)


def _inference(fn, *args):
    with torch.inference_mode():
        return fn(*args)


def main():
    one_tensor()
    small_call_split()
    serving_step()
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
        ("native h2d pageable", lambda: _native.h2d(host, device=0, num_caches=4)),
        ("native h2d pageable, no negated input (views)", lambda: _native.h2d(host, device=0, num_caches=4, consumer_stream=cur, maybe_neg=False)),
        ("native h2d pageable, no negated input, no views", lambda: _native.h2d(host, device=0, num_caches=4, consumer_stream=cur, maybe_neg=False, views=False)),
        ("native h2d pageable, per-tensor handover", lambda: _native.h2d(host, device=0, num_caches=4, consumer_stream=cur, min_run=1 << 30)),
        ("native h2d pinned", lambda: _native.h2d(pinned, device=0, num_caches=4, consumer_stream=cur)),
        ("native d2h", lambda: _native.d2h(dev, device="cuda:0")),
        ("native d2h, no negated input (views)", lambda: _native.d2h(dev, device="cuda:0", maybe_neg=False)),
        ("native d2h, no negated input, no views", lambda: _native.d2h(dev, device="cuda:0", maybe_neg=False, views=False)),
        ("native d2h, per-tensor handover", lambda: _native.d2h(dev, device="cuda:0", min_run=1 << 30)),
        ("torch: a [1000, 256] tensor's unbind(0)", lambda: base.unbind(0)),
        ("torch: the same under torch.no_grad()", lambda: _no_grad(base.unbind, 0)),
        ("torch: the same under torch.inference_mode()", lambda: _inference(base.unbind, 0)),
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
