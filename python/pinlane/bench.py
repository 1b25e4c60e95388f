"""What pinlane buys you on your machine: ``python -m pinlane.bench``.

    python -m pinlane.bench                              # the five standard batches
    python -m pinlane.bench --batch 64x3x224x224:uint8   # your own: COUNT x SHAPE : DTYPE
    python -m pinlane.bench --batch 8x8388608:float32 --batch 1x256:float32 --quick

Each batch moves to the GPU and back every way a user would pick: pinlane, torch `.to`
(`t.to(dev)` / `t.cpu()`), torch pinned (`t.pin_memory().to(dev, non_blocking=True)` / a
copy into `torch.empty(..., pin_memory=True)`), and, when they are installed, spdl's
`transfer_tensor_*` and tensordict's `TensorDict.to`. Every way returns tensors ready for
work on any stream (the torch and tensordict ways end with `torch.cuda.synchronize()`, as
pinlane's calls synchronise inside); every way's result is checked once per batch. Whole
calls are timed (median after warm-up), in one process with the page-locked limit
measured in it (torch, one 256 MiB copy each way): way by way, except D2H of batches of
64 MiB or more, timed in rounds (every way, the limit's copy and the batch's bare copies
into page-locked memory allocated once, in turn call by call, so that all meet the link
in the same stretch of time), and batches under 4 MiB, timed in rounds both directions
(each way a short block of calls in turn, so that all meet the process's changes of
speed alike). A progress line runs on stderr; the table comes at the end. Without
torch or a GPU it says so and exits 0.

The same machinery, more batches and JSON: ``benches/spdl_compare.py`` in the repository.
"""

import argparse
import itertools
import random
import statistics
import sys
import time

# Warm-up calls before timing: pinlane's H2D keeps the last 4 batches alive (num_caches),
# so its device pool grows during the first 5 calls of a batch size.
WARMUPS = 6


def pattern(torch, shape, dtype, seed):
    """Random bytes (not zeros: misplaced bytes show) as a tensor of `dtype` and `shape`
    (`pinlane.testing.patterned`)."""
    from .testing import patterned

    return patterned(dtype, shape, seed)


def leaves(batch):
    return list(batch.values()) if isinstance(batch, dict) else list(batch)


def nbytes_of(batch):
    return sum(t.numel() * t.element_size() for t in leaves(batch))


def same(torch, a, b):
    """Same structure, dtypes, shapes and bytes (NaN patterns included)."""
    from .testing import first_difference

    return first_difference(a, b) is None


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


# D2H of batches of this many bytes or more is timed in rounds: each round calls every
# way once, the page-locked limit's copy, and FLOOR (the batch's copies into page-locked
# memory allocated once), in an order shuffled each round, so that all of them meet the
# link in the same stretch of time. Timed way by way against a limit measured once at the
# start, 8 x 32 MiB D2H came out at 0.970 to 0.988 of the limit for pinlane and 0.969 to
# 0.995 for torch's page-locked way (session 45's three runs); taking turns call by call
# in a small process, at 0.992 / 0.991 and 0.991 / 0.990 (session 46,
# benches/probes/d2h_link.py). H2D stays way by way: its pageable ways read the sources
# with the CPU between the other ways' calls (pinning and copying 256 MiB), not as a
# user's loop runs; in the one run with 8 x 32 MiB H2D in rounds too (session 46, part
# 2), pinlane took 6.66 ms (0.742 of the limit) and torch's page-locked way 8.34 ms,
# against 5.5 to 5.8 and 5.6 to 5.7 way by way in that session's runs B to D.
LINK_BYTES = 64 << 20

# Batches of fewer bytes than this (one tiny tensor, 1000 x 1 KiB) are timed in rounds
# both directions: SMALL_ROUNDS rounds after the warm-up ones, each way called a block of
# `reps // SMALL_ROUNDS` calls in a row per round (its caches warm, as in a user's loop),
# the ways' order shuffled each round. Their calls take microseconds to milliseconds, and
# a process's speed drifts over a run by up to 2x (the pure-Python loop's start and end in
# benches/spdl_compare.py): timed way by way, each in a block of its own, the ratios
# between ways moved with the stretch each way happened to run in (session 51: pinlane's
# 1000 x 1 KiB D2H 1.15 to 1.26 ms in five runs, 1.99 to 2.36 in four). In rounds every
# way meets the same stretches.
SMALL_BYTES = 4 << 20
SMALL_ROUNDS = 20

# The reference row of the rounds: the least any way of moving the batch must do.
FLOOR = "floor: copies into page-locked memory allocated once"


def _limit_copies(torch, dev):
    """The page-locked limit's two copies (one 256 MiB copy each way, synchronised), as
    (bytes, up, down); the buffers live as long as the functions."""
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

    return n, up, down


def limits(torch, dev):
    """The page-locked limit (GB/s) each way: one 256 MiB copy, median of 8."""
    n, up, down = _limit_copies(torch, dev)
    return n / timed(8, up) / 1e9, n / timed(8, down) / 1e9


def rounds(calls, seed=0, block=1):
    """Times `calls` ((name, fn, count) each) taking turns: WARMUPS rounds in which every
    fn is called, then as many rounds as the largest count; a fn with a smaller count is
    called in rounds spread evenly over those and sits out the others. In each round a fn
    is called `block` times in a row, each call timed (a turn of calls on warm caches, as
    a user's loop makes them); the rounds call their fns in an order shuffled afresh (by
    a generator seeded with `seed`), so that no fn always follows the same one. `fn(r)`
    gets the round's number. Returns name -> (seconds of each timed call, `count` x
    `block` of them; CPU seconds per timed call: the process's, all threads, so work a
    call leaves running on other threads is counted with the call after it)."""
    rng = random.Random(seed)
    most = max(count for _, _, count in calls)
    timed_in = {name: {WARMUPS + i * most // count for i in range(count)} for name, _, count in calls}
    times = {name: [] for name, _, _ in calls}
    cpu = dict.fromkeys(times, 0.0)
    for r in range(WARMUPS + most):
        order = list(calls)
        rng.shuffle(order)
        for name, fn, _ in order:
            if r >= WARMUPS and r not in timed_in[name]:
                continue
            for _ in range(block):
                c0 = time.process_time()
                t0 = time.perf_counter()
                fn(r)
                dt = time.perf_counter() - t0
                if r >= WARMUPS:
                    times[name].append(dt)
                    cpu[name] += time.process_time() - c0
    return {name: (v, cpu[name] / max(1, len(v))) for name, v in times.items()}


def _keyed(batch):
    return batch if isinstance(batch, dict) else {f"t{i:04}": t for i, t in enumerate(batch)}


def _like(batch, d):
    """`d` (a mapping) in the structure of `batch` (a dict or a list)."""
    return dict(d.items()) if isinstance(batch, dict) else [d[f"t{i:04}"] for i in range(len(batch))]


def _each(batch, fn):
    return {k: fn(v) for k, v in batch.items()} if isinstance(batch, dict) else [fn(v) for v in batch]


def ways(torch, dev, log=print):
    """name -> (h2d, d2h or None): every way whose library is installed. Batches are lists
    or dicts of CPU (H2D) or CUDA (D2H) tensors."""
    import pinlane

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

    device = str(dev)
    w = {
        "pinlane": (pinlane.transfer_tensor_h2d, lambda b: pinlane.transfer_tensor_d2h(b, device=device)),
        "torch .to": (synced(lambda b: _each(b, lambda t: t.to(dev))), lambda b: _each(b, lambda t: t.cpu())),
        "torch pinned": (synced(lambda b: _each(b, lambda t: t.pin_memory().to(dev, non_blocking=True))),
                         synced(lambda b: _each(b, pinned_out))),
    }
    try:
        from spdl.io import transfer_tensor_d2h as spdl_d2h
        from spdl.io import transfer_tensor_h2d as spdl_h2d

        w["spdl"] = (spdl_h2d, lambda b: spdl_d2h(b, device=device))
    except ImportError:
        log("spdl not installed: left out")
    try:
        from tensordict import TensorDict

        def td_h2d(**kw):
            return synced(lambda b: _like(b, TensorDict(_keyed(b), batch_size=[]).to(dev, **kw)))

        # `non_blocking_pin` and `num_threads` pin host tensors: H2D only.
        w["td non_blocking_pin"] = (td_h2d(non_blocking_pin=True), None)
        w["td non_blocking_pin 8 thr"] = (td_h2d(non_blocking_pin=True, num_threads=8), None)
        w["td non_blocking"] = (td_h2d(non_blocking=True), synced(
            lambda b: _like(b, TensorDict(_keyed(b), batch_size=[]).to("cpu", non_blocking=True))))
    except ImportError:
        log("tensordict not installed: left out")
    return w


def _row(lib, name, direction, nbytes, seconds, cpu_s, limit_gbs, timing, calls, seed=None, block=1):
    return dict(lib=lib, batch=name, direction=direction, bytes=nbytes, median_us=seconds * 1e6,
                gbs=nbytes / seconds / 1e9, fraction_of_limit=nbytes / seconds / 1e9 / limit_gbs,
                cpu_s_per_gb=cpu_s / (nbytes / 1e9), limit_gbs=limit_gbs, timing=timing, calls=calls,
                order_seed=seed, block=block)


def measure(torch, configs, libs, lims, progress=None, dev=None, seed=None):
    """Times every way over every batch. `configs`: (name, sources, reps), sources a list
    of batches (rotated among; every way's bytes are checked once, each way's round trip
    too); `lims`: (H2D, D2H) GB/s. Ways are timed one after another (`timed`), against
    `lims`, D2H reading each way's own H2D results; with `dev`, the D2H of batches of
    LINK_BYTES or more is timed in rounds (`rounds`) with the limit's copy and FLOOR (a
    row of its own, not a way: `fastest` leaves it out), every way reading one device copy
    of the sources (made once for all), and its fraction of the limit is of the limit's
    rate in those rounds; batches under SMALL_BYTES are timed in rounds both directions
    (`_small_rounds`). The rounds' orders are drawn from `seed` (None: a seed drawn now),
    recorded in their rows. Returns rows: lib, batch, direction, bytes, median_us, gbs,
    fraction_of_limit, cpu_s_per_gb, limit_gbs, timing ("rounds" or "blocks"), calls
    (timed calls), order_seed (the rounds' seed, None way by way), block (calls in a row
    per round)."""
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    rows = []
    steps = len(configs) * len(libs)
    k = 0
    for name, sources, reps in configs:
        n = len(sources)
        nbytes = nbytes_of(sources[0])
        in_rounds = dev is not None and nbytes >= LINK_BYTES
        small = dev is not None and nbytes < SMALL_BYTES
        d2h_ways = []
        small_ways = []
        for lib, (h2d, d2h) in libs.items():
            k += 1
            if progress:
                progress(f"[{k}/{steps}] {name}: {lib}")
            # The slow ways get fewer calls on the large batches (they take up to 1 s each).
            r_lib = reps if lib in ("pinlane", "spdl") or nbytes < (64 << 20) else min(reps, 4)
            on = [h2d(s) for s in sources]
            torch.cuda.synchronize()
            assert same(torch, on[0], sources[0]), f"{lib} {name}: H2D changed bytes"
            back = (d2h or (lambda b: _each(b, lambda t: t.cpu())))(on[0])
            assert same(torch, back, sources[0]), f"{lib} {name}: round trip changed bytes"
            del back
            if small:
                small_ways.append((lib, h2d, d2h))
                del on
                continue
            directions = [("H2D", lambda r: h2d(sources[r % n]))]
            if d2h is not None:
                if in_rounds:
                    d2h_ways.append((lib, d2h))
                else:
                    directions.append(("D2H", lambda r: d2h(on[r % n])))
            for direction, fn in directions:
                cpu = []
                m = timed(r_lib, fn, cpu)
                lim = lims[0] if direction == "H2D" else lims[1]
                rows.append(_row(lib, name, direction, nbytes, m, cpu[0], lim, "blocks", r_lib))
            del on  # the closures above read `on` through its cell: this frees the batch
            torch.cuda.empty_cache()
        if d2h_ways:
            if progress:
                progress(f"{name}: D2H, every way in rounds")
            rows += _d2h_rounds(torch, dev, name, sources, reps, d2h_ways, seed + k)
            torch.cuda.empty_cache()
        if small_ways:
            if progress:
                progress(f"{name}: every way in rounds")
            rows += _small_rounds(torch, dev, name, sources, reps, small_ways, lims, seed + k)
            torch.cuda.empty_cache()
    return rows


def _small_rounds(torch, dev, name, sources, reps, small_ways, lims, seed):
    """The rows of `sources` (a batch under SMALL_BYTES) timed in rounds, H2D then D2H
    (orders drawn from `seed` and `seed + 1`): each way of `small_ways` ((lib, h2d, d2h or
    None), their bytes and round trips checked by the caller) called SMALL_ROUNDS times a
    block of calls, each call reading the next of the sources (H2D) or of one device copy
    of them made once for all (D2H), as way by way; each way's D2H bytes checked once
    first. Fractions of the limit are of `lims`, measured at the start."""
    nbytes = nbytes_of(sources[0])
    n = len(sources)
    block = max(1, reps // SMALL_ROUNDS)
    count = max(1, reps // block)

    def rotating(fn, inputs):
        turn = itertools.count()
        return lambda _: fn(inputs[next(turn) % n])

    def rows_of(direction, timed_all, lim, s):
        return [_row(lib, name, direction, nbytes, statistics.median(v), cpu_s, lim, "rounds", len(v), s, block)
                for lib, (v, cpu_s) in timed_all.items()]

    up = rounds([(lib, rotating(h2d, sources), count) for lib, h2d, _ in small_ways], seed, block)
    rows = rows_of("H2D", up, lims[0], seed)
    shared = [_each(s, lambda t: t.to(dev)) for s in sources]
    torch.cuda.synchronize()
    calls = []
    for lib, _, d2h in small_ways:
        if d2h is None:
            continue
        got = d2h(shared[0])
        assert same(torch, got, sources[0]), f"{lib} {name}: D2H changed bytes"
        del got
        calls.append((lib, rotating(d2h, shared), count))
    down = rounds(calls, seed + 1, block)
    return rows + rows_of("D2H", down, lims[1], seed + 1)


# In rounds, a way whose second D2H call (the first is its check) takes longer than this
# is timed in fewer calls (torch's `.cpu()` of 1 GiB takes 0.6 to 0.9 s; every other way
# 5 to 50 ms).
SLOW_CALL_S = 0.1


def _d2h_rounds(torch, dev, name, sources, reps, d2h_ways, seed):
    """The rows of D2H of `sources` timed in rounds (their order drawn from `seed`): each
    way in `d2h_ways` ((lib, d2h)), the limit's copy and FLOOR, all reading one device copy
    of the sources; each way's bytes checked once first."""
    nbytes = nbytes_of(sources[0])
    n = len(sources)
    shared = [_each(s, lambda t: t.to(dev)) for s in sources]
    torch.cuda.synchronize()
    limit_bytes, _, down = _limit_copies(torch, dev)
    calls = [("limit", down, reps), (FLOOR, _floor_d2h(torch, shared[0], sources[0]), reps)]
    for lib, d2h in d2h_ways:
        got = d2h(shared[0])
        assert same(torch, got, sources[0]), f"{lib} {name}: D2H changed bytes"
        del got
        t0 = time.perf_counter()
        d2h(shared[0])
        slow = time.perf_counter() - t0 > SLOW_CALL_S
        calls.append((lib, lambda r, d2h=d2h: d2h(shared[r % n]), min(reps, 4) if slow else reps))
    timed_all = rounds(calls, seed)
    lim_s, _ = timed_all.pop("limit")
    lim = limit_bytes / statistics.median(lim_s) / 1e9
    return [_row(lib, name, "D2H", nbytes, statistics.median(v), cpu_s, lim, "rounds", len(v), seed)
            for lib, (v, cpu_s) in timed_all.items()]


def _floor_d2h(torch, src, batch):
    """FLOOR's call for D2H of `src` (a device copy of `batch`, host tensors): one
    `copy_(non_blocking=True)` per tensor into page-locked tensors allocated once, then a
    synchronize. Its bytes are checked once."""
    out = _each(batch, lambda t: torch.empty(t.shape, dtype=t.dtype, pin_memory=True))
    pairs = list(zip(leaves(out), leaves(src)))

    def call(_):
        for o, t in pairs:
            o.copy_(t, non_blocking=True)
        torch.cuda.synchronize()

    call(0)
    assert same(torch, out, batch), f"{FLOOR}: changed bytes"
    return call


def fastest(rows, libs, batch, direction):
    """(pinlane's row, the fastest other way's row) for one batch and direction."""
    by = {(r["lib"], r["batch"], r["direction"]): r for r in rows}
    others = [lib for lib in libs if lib != "pinlane" and (lib, batch, direction) in by]
    best = min(others, key=lambda lib: by[(lib, batch, direction)]["median_us"])
    return by[("pinlane", batch, direction)], by[(best, batch, direction)]


def standard_batches(torch, quick=False):
    """The five batches of pinlane's benchmarks: (name, sources, reps)."""
    big = 3 if quick else 12
    f32, u8 = torch.float32, torch.uint8
    return [
        ("8 x 32 MiB f32", [{f"t{i:04}": pattern(torch, (8 << 20,), f32, i) for i in range(8)}], big),
        ("1 GiB f32", [[pattern(torch, (256 << 20,), f32, 99)]], min(big, 8)),
        ("64 x 3x224x224 u8", [[pattern(torch, (3, 224, 224), u8, s * 100 + i) for i in range(64)]
                               for s in range(4)], 10 if quick else 30),
        ("1000 x 1 KiB f32", [[pattern(torch, (256,), f32, s * 10000 + i) for i in range(1000)]
                              for s in range(4)], 20 if quick else 60),
        ("1 x 1 KiB f32", [[pattern(torch, (256,), f32, s)] for s in range(8)], 100 if quick else 400),
    ]


def parse_batch(torch, spec, quick=False):
    """`COUNT x D1 x D2 ... : DTYPE` (e.g. `64x3x224x224:uint8`) as a config."""
    try:
        dims, _, dtype_name = spec.replace(" ", "").partition(":")
        parts = [int(p) for p in dims.lower().split("x")]
        dtype = getattr(torch, dtype_name or "float32")
        # A batch of no bytes has no speed to measure.
        if not isinstance(dtype, torch.dtype) or min(parts) < 1:
            raise ValueError
    except (ValueError, AttributeError):
        raise SystemExit(f"pinlane.bench: bad --batch {spec!r}: use COUNT x SHAPE : DTYPE with sizes of 1 "
                         "or more, e.g. 64x3x224x224:uint8")
    count, shape = parts[0], tuple(parts[1:])
    one = pattern(torch, shape, dtype, 0)
    nbytes = count * one.numel() * one.element_size()
    copies = 1 if nbytes >= (64 << 20) else 4
    reps = 6 if nbytes >= (64 << 20) else (30 if quick else 100)
    name = f"{count} x {'x'.join(map(str, shape)) or 'scalar'} {dtype_name or 'float32'}"
    sources = [[pattern(torch, shape, dtype, c * 100003 + i) for i in range(count)] for c in range(copies)]
    return name, sources, reps


def table(rows, libs, configs, out=print):
    out("| batch | dir | pinlane us | GB/s | x limit | fastest other way | its us | pinlane / fastest |")
    out("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for name, _, _ in configs:
        for direction in ("H2D", "D2H"):
            p, b = fastest(rows, libs, name, direction)
            out(f"| {name} | {direction} | {p['median_us']:.1f} | {p['gbs']:.2f} | {p['fraction_of_limit']:.3f} | "
                f"{b['lib']} | {b['median_us']:.1f} | {b['median_us'] / p['median_us']:.2f}x |")
    for line in rounds_notes(rows):
        out("\n" + line)


def rounds_notes(rows):
    """A line for each batch and direction timed in rounds: its seed, the limit the rows'
    fractions are of and FLOOR's figure (the large batches' D2H), or the calls in a row
    each way made per round (the small batches)."""
    lines = [f"{r['batch']} {r['direction']}: every way timed in rounds (order seed {r['order_seed']}), "
             f"x limit against the limit measured in those rounds ({r['limit_gbs']:.1f} GB/s); "
             f"{FLOOR}: {r['median_us']:.1f} us, {r['fraction_of_limit']:.3f} of the limit"
             for r in rows if r["lib"] == FLOOR]
    lines += [f"{r['batch']} {r['direction']}: every way timed in rounds (order seed {r['order_seed']}), "
              f"{r['block']} call(s) in a row per way per round, {r['calls']} timed calls of pinlane"
              for r in rows if r["lib"] == "pinlane" and r["timing"] == "rounds" and r["bytes"] < SMALL_BYTES]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pinlane.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", action="append", default=[],
                    help="COUNT x SHAPE : DTYPE, e.g. 64x3x224x224:uint8 (repeatable); default: the five standard batches")
    ap.add_argument("--quick", action="store_true", help="fewer calls per batch")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("pinlane.bench: torch is not installed: nothing to compare")
        return 0
    import pinlane

    if not pinlane.cuda_available() or not torch.cuda.is_available():
        print(f"pinlane.bench: no CUDA GPU here ({pinlane._native.unavailable_reason() or 'torch sees none'}): "
              "nothing to measure")
        return 0
    dev = torch.device("cuda", pinlane._native.default_device())
    err = sys.stderr

    def progress(msg):
        err.write(f"\r{msg:<72}")
        err.flush()

    progress("measuring the page-locked limit")
    lims = limits(torch, dev)
    configs = [parse_batch(torch, s, args.quick) for s in args.batch] or standard_batches(torch, args.quick)
    libs = ways(torch, dev, log=lambda m: err.write(m + "\n"))
    rows = measure(torch, configs, libs, lims, progress, dev=dev)
    err.write("\r" + " " * 72 + "\r")
    print(f"{torch.cuda.get_device_name(dev)}; page-locked limit in this process: H2D {lims[0]:.1f} GB/s, "
          f"D2H {lims[1]:.1f} GB/s; medians of whole calls, each ready on any stream")
    table(rows, libs, configs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
