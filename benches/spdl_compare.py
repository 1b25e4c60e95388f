"""The batches of PERFORMANCE.md through spdl 0.8.0 (the reference implementation), on the
GPU machine, written as JSON in the schema of `cargo bench --bench transfer -- --json`.

    ../shared/gpu/pack --spdl                  # here
    bash .gpu/with-spdl python3 benches/spdl_compare.py --json $OUT/spdl.json   # there

Whole calls are timed (median after warm-up); sources are rotated among copies for small
batches; every configuration's bytes are checked once; the pinned limit is measured in
this same process with torch (page-locked source, one 256 MiB copy each way).
"""

import argparse
import json
import statistics
import time

import torch
from spdl.io import transfer_tensor_d2h, transfer_tensor_h2d


def pattern(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def nbytes_of(batch):
    ts = batch.values() if isinstance(batch, dict) else batch
    return sum(t.numel() * t.element_size() for t in ts)


def same_tensor(x, y):
    return (x.dtype == y.dtype and x.shape == y.shape
            and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)))


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tensor(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(same_tensor(x, y) for x, y in zip(a, b))


def timed(reps, fn):
    fn(0)
    fn(1)
    v = []
    for r in range(reps):
        t0 = time.perf_counter()
        fn(r)
        v.append(time.perf_counter() - t0)
    return statistics.median(v)


def limits(dev):
    n = 256 << 20
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    host.fill_(7)
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    back = torch.empty(n, dtype=torch.uint8).pin_memory()

    def up(_):
        d.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

    def down(_):
        back.copy_(d, non_blocking=True)
        torch.cuda.synchronize()

    return n / timed(8, up) / 1e9, n / timed(8, down) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    h2d_lim, d2h_lim = limits(dev)
    print(f"pinned limit (torch, this process): H2D {h2d_lim:.1f} GB/s, D2H {d2h_lim:.1f} GB/s")
    big = 3 if args.quick else 8
    f32, u8 = torch.float32, torch.uint8
    configs = [
        ("8 x 32 MiB f32", [{f"t{i:04}": pattern((8 << 20,), f32, i) for i in range(8)}], big),
        ("1 GiB f32", [[pattern((256 << 20,), f32, 99)]], min(big, 6)),
        ("64 x 3x224x224 u8", [[pattern((3, 224, 224), u8, s * 100 + i) for i in range(64)] for s in range(4)], 30),
        ("1000 x 1 KiB f32", [[pattern((256,), f32, s * 10000 + i) for i in range(1000)] for s in range(4)], 60),
        ("1 x 1 KiB f32", [[pattern((256,), f32, s)] for s in range(8)], 200),
    ]
    rows = []
    for name, sources, reps in configs:
        n = len(sources)
        nbytes = nbytes_of(sources[0])
        on = [transfer_tensor_h2d(s) for s in sources]
        torch.cuda.synchronize()
        back = transfer_tensor_d2h(on[0], device="cuda:0")
        assert same(back, sources[0]), f"{name}: spdl round trip changed bytes"
        del back
        m = timed(reps, lambda r: transfer_tensor_h2d(sources[r % n]))
        rows.append(dict(batch=name, direction="H2D pageable", bytes=nbytes, median_us=m * 1e6,
                         gbs=nbytes / m / 1e9, fraction_of_limit=nbytes / m / 1e9 / h2d_lim))
        m = timed(reps, lambda r: transfer_tensor_d2h(on[r % n], device="cuda:0"))
        rows.append(dict(batch=name, direction="D2H", bytes=nbytes, median_us=m * 1e6,
                         gbs=nbytes / m / 1e9, fraction_of_limit=nbytes / m / 1e9 / d2h_lim))
        del on
        torch.cuda.empty_cache()
    print(f"{'batch':<26} {'direction':<14} {'GB/s':>8} {'x limit':>8} {'us/batch':>12}")
    for r in rows:
        print(f"{r['batch']:<26} {r['direction']:<14} {r['gbs']:>8.2f} {r['fraction_of_limit']:>8.3f} {r['median_us']:>12.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(tool="spdl 0.8.0", limits=dict(h2d=h2d_lim, d2h=d2h_lim), rows=rows), f, indent=1)
        print("wrote", args.json)


if __name__ == "__main__":
    main()
