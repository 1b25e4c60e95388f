"""pinlane's Python package against what users would pick instead, in one process, on the
same torch tensors: every batch of ../shared/PERFORMANCE.md, both directions.

    ../shared/gpu/pack --peers                                  # here (spdl, tensordict)
    bash .gpu/with-python python3 benches/spdl_compare.py \\
        --json $OUT/py_compare.json --rust $OUT/pinlane.json --png $OUT/py_compare.png   # there

The machinery is the package's own `python -m pinlane.bench` (python/pinlane/bench.py);
this script adds the Rust bench's figures, the JSON and the plot. The ways, each giving a batch of the same structure whose tensors are ready for work on
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
beside each figure); sources are rotated among copies for small batches; every
configuration's bytes are checked once for each way; the pinned limit is measured in this
same process with torch (page-locked memory, one 256 MiB copy each way). Each way is
timed in a block of calls of its own against the limit measured at the start, except D2H
of the two large batches (8 x 32 MiB, 1 GiB: at the link), timed in rounds: every way,
the limit's copy and the batch's bare copies into page-locked memory allocated once
(printed after the table as the floor) in turn call by call, each way's "x limit" of the
limit's rate in those rounds (the JSON rows' `limit_gbs` and `timing`;
`pinlane.bench.measure`). The two small batches (one 1 KiB tensor, 1000 x 1 KiB) are
timed in rounds both directions (since session 52): each way a block of calls in turn,
20 rounds, the order shuffled each round, against the limit measured at the start (the
rows' `block`; `pinlane.bench.SMALL_BYTES`). With `--rust`, the JSON of `bench-transfer --json` from the same
session is read to put the Rust figures beside the Python ones (the
"within 1.1x of Rust" target).

The process's own speed is printed at the start and the end (`host_python_loop_us` in the
JSON): a pure-Python loop of 20,000 additions, median of 21 runs. Processes on one GPU
machine differ, and one process over minutes: the loop took 707 to 760 us in some and
1,345 to 1,629 in others (session 50, `benches/probes/slow_mode.py` and this bench), and
the per-tensor rows (1000 x 1 KiB) move with it.
"""

import argparse
import json
import statistics
import time

import torch

from pinlane.bench import fastest, limits, measure, rounds_notes, standard_batches, ways


def python_loop_us():
    """Median of 21 runs of a pure-Python loop (no torch, no allocation of note), us."""
    v = []
    for _ in range(21):
        t0 = time.perf_counter()
        x = 0
        for i in range(20000):
            x += i & 7
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--rust", default=None, help="bench-transfer --json output of this session")
    ap.add_argument("--png", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    loop_start = python_loop_us()
    print(f"this process's speed: a pure-Python loop of 20,000 additions {loop_start:.0f} us")
    h2d_lim, d2h_lim = limits(torch, dev)
    print(f"pinned limit (torch, this process): H2D {h2d_lim:.1f} GB/s, D2H {d2h_lim:.1f} GB/s")
    configs = standard_batches(torch, args.quick)
    libs = ways(torch, dev)
    rows = measure(torch, configs, libs, (h2d_lim, d2h_lim), dev=dev)
    rust = {}
    if args.rust:
        with open(args.rust) as f:
            for r in json.load(f)["rows"]:
                key = {"H2D pageable": "H2D", "D2H pinned out": "D2H"}.get(r["direction"])
                if key:
                    rust[(r["batch"], key)] = r
    by = {(r["lib"], r["batch"], r["direction"]): r for r in rows}
    print()
    print("| batch | dir | " + " | ".join(libs) + " | fastest other | pinlane / fastest | pinlane x limit | Rust bench | Python / Rust |")
    print("| --- | --- | " + " | ".join("---:" for _ in libs) + " | --- | ---: | ---: | ---: | ---: |")
    table = []
    for name, _, _ in configs:
        for direction in ("H2D", "D2H"):
            p, b = fastest(rows, libs, name, direction)
            r = rust.get((name, direction))
            ratio = b["median_us"] / p["median_us"]
            cells = " | ".join(f"{by[(lib, name, direction)]['median_us']:.1f}" if (lib, name, direction) in by else "-"
                               for lib in libs)
            rust_txt = f"{r['median_us']:.1f}" if r else "-"
            vs_rust = f"{p['median_us'] / r['median_us']:.2f}" if r else "-"
            print(f"| {name} | {direction} | {cells} | {b['lib']} ({b['fraction_of_limit']:.3f} of limit) | "
                  f"{ratio:.2f}x | {p['fraction_of_limit']:.3f} | {rust_txt} | {vs_rust} |")
            table.append(dict(batch=name, direction=direction, pinlane=p, fastest_other=b["lib"],
                              other=b, spdl=by.get(("spdl", name, direction)),
                              rust_us=r["median_us"] if r else None, speedup=ratio))
    for line in rounds_notes(rows):
        print(line)
    print("\n(us per batch, median; CPU s/GB in the JSON)")
    loop_end = python_loop_us()
    print(f"this process's speed at the end: the same loop {loop_end:.0f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(limits=dict(h2d=h2d_lim, d2h=d2h_lim), rows=rows, table=table,
                           host_python_loop_us=[loop_start, loop_end]), f, indent=1)
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
