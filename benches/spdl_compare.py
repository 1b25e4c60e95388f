"""spdl 0.8.0 and pinlane's Python package in one process, on the same torch tensors:
every batch of ../shared/PERFORMANCE.md, both directions.

    ../shared/gpu/pack --spdl                                   # here
    bash .gpu/with-python python3 benches/spdl_compare.py \\
        --json $OUT/py_compare.json --rust $OUT/pinlane.json --png $OUT/py_compare.png   # there

Whole calls are timed (median after warm-up; the process's CPU time per GB, all threads,
beside each figure), the two libraries taking turns configuration
by configuration; sources are rotated among copies for small batches; every
configuration's bytes are checked once for each library; the pinned limit is measured in
this same process with torch (page-locked memory, one 256 MiB copy each way). With
`--rust`, the JSON of `bench-transfer --json` from the same session is read to put the
Rust figures beside the Python ones (the "within 1.1x of Rust" target).
"""

import argparse
import json
import statistics
import time

import torch

import pinlane
from spdl.io import transfer_tensor_d2h as spdl_d2h
from spdl.io import transfer_tensor_h2d as spdl_h2d


def pattern(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def leaves(batch):
    return list(batch.values()) if isinstance(batch, dict) else list(batch)


def nbytes_of(batch):
    return sum(t.numel() * t.element_size() for t in leaves(batch))


def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and a.keys() != b.keys():
        return False
    xs, ys = leaves(a), leaves(b)
    return len(xs) == len(ys) and all(
        x.dtype == y.dtype and x.shape == y.shape
        and torch.equal(x.cpu().reshape(-1).view(torch.uint8), y.cpu().reshape(-1).view(torch.uint8))
        for x, y in zip(xs, ys))


# Warm-up calls: pinlane's H2D keeps the last 4 batches alive (num_caches), so its device
# pool grows during the first 5 calls of a batch size; time after that (as bench-transfer).
WARMUPS = 6


def timed(reps, fn, cpu=None):
    """Median seconds per call after WARMUPS calls; with `cpu` (a list), appends the
    process CPU seconds (all threads) per call, averaged over the timed calls."""
    for w in range(WARMUPS):
        fn(w)
    v = []
    c0 = time.process_time()
    for r in range(reps):
        t0 = time.perf_counter()
        fn(r)
        v.append(time.perf_counter() - t0)
    if cpu is not None:
        cpu.append((time.process_time() - c0) / reps)
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


LIBS = {
    "spdl 0.8.0": (spdl_h2d, lambda b: spdl_d2h(b, device="cuda:0")),
    "pinlane": (pinlane.transfer_tensor_h2d, lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0")),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--rust", default=None, help="bench-transfer --json output of this session")
    ap.add_argument("--png", default=None)
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
        ("1 x 1 KiB f32", [[pattern((256,), f32, s)] for s in range(8)], 400),
    ]
    rows = []
    for name, sources, reps in configs:
        n = len(sources)
        nbytes = nbytes_of(sources[0])
        for lib, (h2d, d2h) in LIBS.items():
            on = [h2d(s) for s in sources]
            torch.cuda.synchronize()
            assert same(on[0], sources[0]), f"{lib} {name}: H2D changed bytes"
            back = d2h(on[0])
            assert same(back, sources[0]), f"{lib} {name}: round trip changed bytes"
            del back
            for direction, fn in (("H2D", lambda r: h2d(sources[r % n])),
                                  ("D2H", lambda r: d2h(on[r % n]))):
                cpu = []
                m = timed(reps, fn, cpu)
                lim = h2d_lim if direction == "H2D" else d2h_lim
                rows.append(dict(lib=lib, batch=name, direction=direction, bytes=nbytes,
                                 median_us=m * 1e6, gbs=nbytes / m / 1e9,
                                 fraction_of_limit=nbytes / m / 1e9 / lim,
                                 cpu_s_per_gb=cpu[0] / (nbytes / 1e9)))
            del on
            torch.cuda.empty_cache()
    rust = {}
    if args.rust:
        with open(args.rust) as f:
            for r in json.load(f)["rows"]:
                key = {"H2D pageable": "H2D", "D2H pinned out": "D2H"}.get(r["direction"])
                if key:
                    rust[(r["batch"], key)] = r
    by = {(r["lib"], r["batch"], r["direction"]): r for r in rows}
    print()
    print("| batch | direction | pinlane (Python) | x limit | CPU s/GB | spdl 0.8.0 | CPU s/GB | pinlane / spdl | Rust bench | Python / Rust time |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    table = []
    for name, _, _ in configs:
        for direction in ("H2D", "D2H"):
            p, s = by[("pinlane", name, direction)], by[("spdl 0.8.0", name, direction)]
            r = rust.get((name, direction))
            ratio = s["median_us"] / p["median_us"]
            rust_txt = f"{r['median_us']:.1f} us" if r else "-"
            vs_rust = f"{p['median_us'] / r['median_us']:.2f}" if r else "-"
            print(f"| {name} | {direction} | {p['gbs']:.2f} GB/s, {p['median_us']:.1f} us | "
                  f"{p['fraction_of_limit']:.3f} | {p['cpu_s_per_gb']:.3f} | "
                  f"{s['gbs']:.2f} GB/s, {s['median_us']:.1f} us | {s['cpu_s_per_gb']:.3f} | "
                  f"{ratio:.1f}x | {rust_txt} | {vs_rust} |")
            table.append(dict(batch=name, direction=direction, pinlane=p, spdl=s,
                              rust_us=r["median_us"] if r else None, speedup=ratio))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(limits=dict(h2d=h2d_lim, d2h=d2h_lim), rows=rows, table=table), f, indent=1)
        print("wrote", args.json)
    if args.png:
        plot(table, args.png)


def plot(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, direction in zip(axes, ("H2D", "D2H")):
        rows = [t for t in table if t["direction"] == direction]
        names = [t["batch"] for t in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [t["spdl"]["median_us"] for t in rows], 0.4, label="spdl 0.8.0")
        ax.bar([i + 0.2 for i in x], [t["pinlane"]["median_us"] for t in rows], 0.4, label="pinlane (Python)")
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=20, fontsize=8)
        ax.set_ylabel("us per batch (log; lower is better)")
        ax.set_title(f"{direction}, one process, same torch tensors, H200")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


if __name__ == "__main__":
    main()
