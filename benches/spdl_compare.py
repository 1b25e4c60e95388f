"""pinlane's Python package against what users would pick instead, in one process, on the
same torch tensors: every batch of ../shared/PERFORMANCE.md, both directions.

    ../shared/gpu/pack --peers                                  # here (spdl, tensordict)
    bash .gpu/with-python python3 benches/spdl_compare.py \\
        --json $OUT/py_compare.json --rust $OUT/pinlane.json --png $OUT/py_compare.png   # there

The ways, each giving a batch of the same structure whose tensors are ready for work on
any stream when the call returns (so the torch ways end with a synchronize, as pinlane's
and spdl's calls do inside):

* pinlane, spdl 0.8.0 (`transfer_tensor_h2d` / `transfer_tensor_d2h`);
* torch `.to`: `t.to(dev)` per tensor / `t.cpu()`;
* torch pinned: `t.pin_memory().to(dev, non_blocking=True)` / a copy into
  `torch.empty(..., pin_memory=True)` with `copy_(non_blocking=True)`;
* tensordict 0.15.3: `TensorDict(batch).to(dev, non_blocking_pin=True)` (also with
  `num_threads=8`) and `.to(dev, non_blocking=True)`; D2H `.to("cpu", non_blocking=True)`
  (the pinning options are H2D's). Building the TensorDict from the batch is part of the
  call.

Ways whose library is not installed are left out (`--peers` carries spdl and tensordict).
Whole calls are timed (median after warm-up; the process's CPU time per GB, all threads,
beside each figure), the ways taking turns configuration by configuration; sources are
rotated among copies for small batches; every configuration's bytes are checked once for
each way; the pinned limit is measured in this same process with torch (page-locked
memory, one 256 MiB copy each way). With `--rust`, the JSON of `bench-transfer --json`
from the same session is read to put the Rust figures beside the Python ones (the
"within 1.1x of Rust" target).
"""

import argparse
import json
import statistics
import time

import torch

import pinlane


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


def as_list(batch):
    return batch if isinstance(batch, dict) else {f"t{i:04}": t for i, t in enumerate(batch)}


def like(batch, d):
    """`d` (a mapping) in the structure of `batch` (a dict or a list)."""
    return dict(d.items()) if isinstance(batch, dict) else [d[f"t{i:04}"] for i in range(len(batch))]


def each(batch, fn):
    return {k: fn(v) for k, v in batch.items()} if isinstance(batch, dict) else [fn(v) for v in batch]


def synced(fn):
    def call(b):
        out = fn(b)
        torch.cuda.synchronize()
        return out
    return call


def pinned_out(t):
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


def ways(dev):
    """name -> (h2d, d2h): every way whose library is installed."""
    w = {
        "pinlane": (pinlane.transfer_tensor_h2d, lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0")),
        "torch .to": (synced(lambda b: each(b, lambda t: t.to(dev))), lambda b: each(b, lambda t: t.cpu())),
        "torch pinned": (synced(lambda b: each(b, lambda t: t.pin_memory().to(dev, non_blocking=True))),
                         synced(lambda b: each(b, pinned_out))),
    }
    try:
        from spdl.io import transfer_tensor_d2h as spdl_d2h
        from spdl.io import transfer_tensor_h2d as spdl_h2d

        w["spdl 0.8.0"] = (spdl_h2d, lambda b: spdl_d2h(b, device="cuda:0"))
    except ImportError:
        print("spdl not installed: left out")
    try:
        from tensordict import TensorDict

        def td_h2d(**kw):
            return synced(lambda b: like(b, TensorDict(as_list(b), batch_size=[]).to(dev, **kw)))

        # `non_blocking_pin` and `num_threads` pin host tensors: H2D only.
        w["td non_blocking_pin"] = (td_h2d(non_blocking_pin=True), None)
        w["td non_blocking_pin 8 thr"] = (td_h2d(non_blocking_pin=True, num_threads=8), None)
        w["td non_blocking"] = (td_h2d(non_blocking=True), synced(
            lambda b: like(b, TensorDict(as_list(b), batch_size=[]).to("cpu", non_blocking=True))))
    except ImportError:
        print("tensordict not installed: left out")
    return w


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
    libs = ways(dev)
    for name, sources, reps in configs:
        n = len(sources)
        nbytes = nbytes_of(sources[0])
        for lib, (h2d, d2h) in libs.items():
            # The slow ways get fewer calls on the large batches (they take up to 1 s each).
            r_lib = reps if lib in ("pinlane", "spdl 0.8.0") or nbytes < (64 << 20) else min(reps, 4)
            on = [h2d(s) for s in sources]
            torch.cuda.synchronize()
            assert same(on[0], sources[0]), f"{lib} {name}: H2D changed bytes"
            back = (d2h or (lambda b: each(b, lambda t: t.cpu())))(on[0])
            assert same(back, sources[0]), f"{lib} {name}: round trip changed bytes"
            del back
            directions = [("H2D", lambda r: h2d(sources[r % n]))]
            if d2h is not None:
                directions.append(("D2H", lambda r: d2h(on[r % n])))
            for direction, fn in directions:
                cpu = []
                m = timed(r_lib, fn, cpu)
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
    others = [lib for lib in libs if lib != "pinlane"]
    print()
    print("| batch | dir | " + " | ".join(libs) + " | fastest other | pinlane / fastest | pinlane x limit | Rust bench | Python / Rust |")
    print("| --- | --- | " + " | ".join("---:" for _ in libs) + " | --- | ---: | ---: | ---: | ---: |")
    table = []
    for name, _, _ in configs:
        for direction in ("H2D", "D2H"):
            p = by[("pinlane", name, direction)]
            best = min((lib for lib in others if (lib, name, direction) in by),
                       key=lambda lib: by[(lib, name, direction)]["median_us"])
            b = by[(best, name, direction)]
            r = rust.get((name, direction))
            ratio = b["median_us"] / p["median_us"]
            cells = " | ".join(f"{by[(lib, name, direction)]['median_us']:.1f}" if (lib, name, direction) in by else "-"
                               for lib in libs)
            rust_txt = f"{r['median_us']:.1f}" if r else "-"
            vs_rust = f"{p['median_us'] / r['median_us']:.2f}" if r else "-"
            print(f"| {name} | {direction} | {cells} | {best} ({b['fraction_of_limit']:.3f} of limit) | "
                  f"{ratio:.2f}x | {p['fraction_of_limit']:.3f} | {rust_txt} | {vs_rust} |")
            table.append(dict(batch=name, direction=direction, pinlane=p, fastest_other=best,
                              other=b, spdl=by.get(("spdl 0.8.0", name, direction)),
                              rust_us=r["median_us"] if r else None, speedup=ratio))
    print("\n(us per batch, median; CPU s/GB in the JSON)")
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
        ax.bar([i - 0.2 for i in x], [t["other"]["median_us"] for t in rows], 0.4, label="fastest other way")
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
