"""The serving step: a handful of small host tensors copied every step into device
buffers the server already owns (slices of static buffers, as a CUDA-graph server keeps
its inputs), timed in one process on the GPU machine.

    bash .gpu/with-python python3 benches/copy_into.py [--json OUT] [--reps N]

Ways, each timed as a whole step (the copies, then the current stream synchronised, so
the data is on the device) by median over `--reps` steps after warm-up, ways taking
turns config by config:

* ``torch copy_``: ``dst.copy_(src, non_blocking=True)`` per tensor (what servers do);
* ``pinlane copy_into``: ``pinlane.copy_into(dsts, srcs)``, one call for the step;
* ``pinlane Buffers``: ``bufs.copy_from(srcs)``, the destinations checked and imported
  once (``bufs = pinlane.Buffers(dsts)``), as a serving loop would;
* ``pinlane Pairs``: ``pairs.copy()``, the sources bound to the destinations once too
  (``pairs = pinlane.Pairs(bufs, srcs)``), as a loop that refills the same host tensors
  every step would (the sources here are the same tensors every step);
* ``pinlane h2d``: ``pinlane.transfer_tensor_h2d(srcs)`` of the same batch (new device
  tensors, not the static buffers: the engine's own path, for reference);
* ``pinlane Pairs in place``: ``pinlane.Pairs(bufs, srcs, in_place=True)``, whose sources
  the device reads in place: page-locked ones as they are, pageable ones page-locked in
  place at binding. Timed last in each config, its ``Pairs`` made just before and
  dropped after (while it lives, the pageable sources are page-locked, which would change
  the other ways); left out by builds without the option.

Configs: 8 and 16 tensors of 256 B to 256 KiB, and 16 of 256 B to 4 KiB (sizes fixed per
config by a seed), from pageable and from page-locked sources, into 256-byte-aligned slices of one static buffer.
Each way's bytes are checked once per config (after its timed steps). Prints µs per step,
GB/s, the fraction of the page-locked limit (one 256 MiB copy, measured in this process)
and the CPU seconds per GB; the ratio torch / pinlane per config; JSON with `--json`.
"""

import argparse
import json
import random
import statistics
import sys
import time

import torch

import pinlane
from pinlane.bench import limits, pattern

WARMUP = 20

# `Pairs(..., in_place=True)`: every source read in place by the device.
IN_PLACE = "pinlane Pairs in place"
CALL_NAMES = {"pinlane Pairs": "Pairs.copy", IN_PLACE: "Pairs(in_place).copy"}


def sizes(n, seed, top=18):
    """`n` byte sizes from 256 B to 2**top bytes (256 KiB), log-uniform, multiples of 8."""
    rng = random.Random(seed)
    return [int(2 ** rng.uniform(8, top)) // 8 * 8 for _ in range(n)]


def batch(n_bytes, seed, pinned):
    out = {}
    for i, nb in enumerate(n_bytes):
        dtype = (torch.int64, torch.int32, torch.float32, torch.int64)[i % 4]
        t = pattern(torch, (nb // torch.empty((), dtype=dtype).element_size(),), dtype, seed + i)
        out[f"t{i:02}"] = t.pin_memory() if pinned else t
    return out


def statics(src, dev):
    """Each tensor's destination: a 256-byte-aligned slice of one uint8 buffer."""
    places, end = {}, 0
    for k, v in src.items():
        at = -(-end // 256) * 256
        places[k] = (at, v.numel() * v.element_size())
        end = at + places[k][1]
    buf = torch.zeros(end, dtype=torch.uint8, device=dev)
    return {k: buf[a : a + n].view(src[k].dtype) for k, (a, n) in places.items()}


def run_step(way, src, dst, bufs=None, pairs=()):
    if way == "torch copy_":
        for k, s in src.items():
            dst[k].copy_(s, non_blocking=True)
    elif way == "pinlane copy_into":
        pinlane.copy_into(dst, src)
    elif way == "pinlane Buffers":
        bufs.copy_from(src)
    elif way in pairs:
        pairs[way].copy()
    else:
        pinlane.transfer_tensor_h2d(src)
    torch.cuda.current_stream().synchronize()


def timed(reps, fn):
    for _ in range(WARMUP):
        fn()
    v = []
    c0 = time.process_time()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v), (time.process_time() - c0) / reps


def same_bytes(a, b):
    """Byte for byte (random float bytes hold NaNs, which torch.equal calls unequal)."""
    return torch.equal(a.cpu().contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check(way, src, dst, bufs, pairs):
    if way == "pinlane h2d":
        got = pinlane.transfer_tensor_h2d(src)
        return all(same_bytes(got[k], v) for k, v in src.items())
    for d in dst.values():
        d.zero_()
    run_step(way, src, dst, bufs, pairs)
    return all(same_bytes(dst[k], v) for k, v in src.items())


def parts(reps, step):
    """Where a step's time goes (`step()`: a Buffers or a Pairs step): the call itself
    (until it returns, the copies queued), and the device's span from before the call to
    after its copies (CUDA events on the stream), medians over `reps` steps."""
    s = torch.cuda.current_stream()
    calls, spans, marks = [], [], {}
    for r in range(WARMUP + reps):
        pinlane._native.trace_next_call()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(s)
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        e1.record(s)
        s.synchronize()
        if r >= WARMUP:
            calls.append((t1 - t0) * 1e6)
            spans.append(e0.elapsed_time(e1) * 1e3)
            for name, us in pinlane._native.last_trace() or []:
                marks.setdefault(name, []).append(us)
    engine = ", ".join(f"{n} {statistics.median(v):.1f}" for n, v in marks.items())
    return statistics.median(calls), statistics.median(spans), engine


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--json")
    ap.add_argument(
        "--configure",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pinlane.configure setting for this process (repeatable), e.g. parallel_min=1048576",
    )
    a = ap.parse_args(argv)
    if a.configure:
        pinlane.configure(**dict(kv.split("=", 1) for kv in a.configure))
        print(f"pinlane.configure: {a.configure}")
    if not (torch.cuda.is_available() and pinlane.cuda_available()):
        print("no GPU: nothing to measure")
        return 0
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    up, _ = limits(torch, dev)
    print(f"page-locked limit H2D (torch, one 256 MiB copy): {up:.1f} GB/s")
    ways = ["torch copy_", "pinlane copy_into", "pinlane Buffers", "pinlane Pairs", "pinlane h2d"]
    try:  # builds before Pairs' in_place (an A/B's old wheel) lack the way
        pinlane.Pairs([torch.zeros(1, device=dev)], [torch.zeros(1)], in_place=True)
        ways.append(IN_PLACE)
    except TypeError:
        print("this build's Pairs has no in_place: that way is left out")
    rows = []
    # 8 and 16 tensors up to 256 KiB; 16 up to 4 KiB (a decode step's ids and lengths).
    for n, top in ((8, 18), (16, 18), (16, 12)):
        n_bytes = sizes(n, 1000 + n if top == 18 else 2000 + n, top)
        for pinned in (False, True):
            src = batch(n_bytes, n, pinned)
            dst = statics(src, dev)
            bufs = pinlane.Buffers(dst)
            pairs = {"pinlane Pairs": pinlane.Pairs(bufs, src)}
            total = sum(n_bytes)
            label = f"{n} tensors, {total / 1024:.0f} KiB, {'page-locked' if pinned else 'pageable'}"
            res = {}

            def time_way(way, pairs):
                sec, cpu = timed(a.reps, lambda: run_step(way, src, dst, bufs, pairs))
                ok = check(way, src, dst, bufs, pairs)
                res[way] = {
                    "us": sec * 1e6,
                    "gbps": total / sec / 1e9,
                    "of_limit": total / sec / 1e9 / up,
                    "cpu_s_per_gb": cpu / (total / 1e9),
                    "checked": ok,
                }
                print(
                    f"{label:40} {way:18} {sec * 1e6:8.1f} us  {total / sec / 1e9:6.2f} GB/s"
                    f"  {total / sec / 1e9 / up:5.3f} of limit  {cpu / (total / 1e9):7.2f} CPU-s/GB"
                    f"  bytes {'ok' if ok else 'WRONG'}",
                    flush=True,
                )

            def split(way, name, step):
                call_us, span_us, engine = parts(a.reps // 4, step)
                print(
                    f"{label:40} {name}'s call {call_us:.1f} us; device span {span_us:.1f} us;"
                    f" the engine's marks (us from its start): {engine}",
                    flush=True,
                )
                res[way].update(call_us=call_us, span_us=span_us, engine_marks=engine)

            for way in ways:
                if way != IN_PLACE:
                    time_way(way, pairs)
            split("pinlane Buffers", "Buffers.copy_from", lambda: bufs.copy_from(src))
            split("pinlane Pairs", CALL_NAMES["pinlane Pairs"], pairs["pinlane Pairs"].copy)
            if IN_PLACE in ways:
                # Last: while it lives, its pageable sources are page-locked (which torch's
                # copy_ and pinlane's per-call imports would see).
                in_place = {IN_PLACE: pinlane.Pairs(bufs, src, in_place=True)}
                time_way(IN_PLACE, in_place)
                split(IN_PLACE, CALL_NAMES[IN_PLACE], in_place[IN_PLACE].copy)
                del in_place
            rows.append({"config": label, "tensors": n, "bytes": total, "pinned": pinned, "ways": res})
    print()
    ip = IN_PLACE in ways
    print(
        "| step | torch copy_ | pinlane copy_into | pinlane Buffers | pinlane Pairs | pinlane h2d "
        + ("| Pairs in place " if ip else "")
        + "| torch / copy_into | torch / Buffers | torch / Pairs | h2d / Buffers | h2d / Pairs |"
        + (" torch / Pairs in place |" if ip else "")
    )
    print("| --- |" + " ---: |" * (10 + 2 * ip))
    for r in rows:
        w = r["ways"]
        t, c, b, p, h = (w[x]["us"] for x in ways[:5])
        q = w[IN_PLACE]["us"] if ip else None
        print(
            f"| {r['config']} | {t:.1f} us | {c:.1f} us | {b:.1f} us | {p:.1f} us | {h:.1f} us "
            + (f"| {q:.1f} us " if ip else "")
            + f"| {t / c:.2f}x | {t / b:.2f}x | {t / p:.2f}x | {h / b:.2f}x | {h / p:.2f}x |"
            + (f" {t / q:.2f}x |" if ip else "")
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"limit_h2d_gbps": up, "rows": rows}, f, indent=1)
    return 0 if all(w["checked"] for r in rows for w in r["ways"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
