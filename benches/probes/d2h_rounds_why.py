"""Probe (session 47): why, inside the peers bench's process, pinlane's and torch's
page-locked 8 x 32 MiB D2H take 100 to 200 us more than the floor (the same copies into
page-locked memory allocated once), where in `d2h_link.py`'s process they took 20 to 50 us
more.

    bash .gpu/with-python python3 benches/probes/d2h_rounds_why.py [--peers] [--no-cpu]

The ways take turns call by call in rounds whose order is shuffled (seeded), as the peers
bench's rounds do, all reading one device copy of the batch (a dict of 8 x 32 MiB f32):

* limit: one 256 MiB copy into a page-locked buffer allocated once;
* floor x1 / x2 / x4: the 8 copies into page-locked tensors allocated once, one set, or
  2 or 4 sets taken in turn (does a destination the device wrote less recently slow the
  copies?);
* torch pinned: the peers bench's way (`torch.empty(..., pin_memory=True)` per call);
* pinlane dict / pinlane list: `pinlane.transfer_tensor_d2h` of the dict, and of its
  values as a list; pinlane native: the native half's call on the list (no Python half);
* torch .cpu(): the peers bench's slow way (256 MiB of fresh pageable memory per call),
  left out with `--no-cpu`. `--peers` also imports spdl and tensordict and adds spdl's
  and tensordict's D2H, as in the peers bench.

Prints per way: the median call with its outputs' drop (us: as the peers bench times it),
its fraction of the limit (the limit's median in the same rounds), the call with its
outputs held past the timer and their drop alone, and the median of the calls that came
straight after a `.cpu()` call and of the others; then (session 48) each way's median by
the way that ran just before it (`--rounds N` for more samples per cell). Then the phases
(pinlane's trace marks, us from the engine call's start) of traced pinlane calls, right
after a floor call, torch's page-locked way, pinlane's own call and a `.cpu()` call, and
pinlane's memory statistics. Every way's bytes are checked once.
"""

import argparse
import random
import statistics
import time

import torch

import pinlane
from pinlane import _native

WARM, ROUNDS = 6, 40
MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args()
    seed = random.SystemRandom().randrange(1 << 32) if args.seed is None else args.seed
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(1)
    batch = {f"t{i:04}": torch.rand(8 * MiB, device=dev, generator=g) for i in range(8)}
    values = list(batch.values())
    want = [t.cpu() for t in values]
    whole = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
    whole_out = torch.empty(256 * MiB, dtype=torch.uint8, pin_memory=True)
    sets = [[torch.empty_like(t, device="cpu", pin_memory=True) for t in values] for _ in range(4)]
    torch.cuda.synchronize()

    def limit(_):
        whole_out.copy_(whole, non_blocking=True)
        torch.cuda.synchronize()

    def floor(k):
        def call(r):
            outs = sets[r % k]
            for o, t in zip(outs, values):
                o.copy_(t, non_blocking=True)
            torch.cuda.synchronize()
            return outs
        return call

    def torch_pinned(_):
        r = []
        for t in values:
            o = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            o.copy_(t, non_blocking=True)
            r.append(o)
        torch.cuda.synchronize()
        return r

    def pl_dict(_):
        return list(pinlane.transfer_tensor_d2h(batch, device="cuda:0").values())

    def pl_list(_):
        return pinlane.transfer_tensor_d2h(values, device="cuda:0")

    def pl_native(_):
        return _native.d2h(values, device="cuda:0", maybe_neg=False)

    def to_cpu(_):
        return [t.cpu() for t in values]

    ways = [("limit", limit), ("floor x1", floor(1)), ("floor x2", floor(2)), ("floor x4", floor(4)),
            ("torch pinned", torch_pinned), ("pinlane dict", pl_dict), ("pinlane list", pl_list),
            ("pinlane native", pl_native)]
    if not args.no_cpu:
        ways.append(("torch .cpu()", to_cpu))
    if args.peers:
        from spdl.io import transfer_tensor_d2h as spdl_d2h
        from tensordict import TensorDict

        ways.append(("spdl", lambda _: list(spdl_d2h(batch, device="cuda:0").values())))

        def td(_):
            out = TensorDict(batch, batch_size=[]).to("cpu", non_blocking=True)
            torch.cuda.synchronize()
            return [out[k] for k in batch]
        ways.append(("td non_blocking", td))

    for name, fn in ways[1:]:
        for r in range(4):
            got = fn(r)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), name
    del got

    rng = random.Random(seed)
    times = {n: [] for n, _ in ways}
    by_prev = {}
    held = {n: [] for n, _ in ways}
    drops = {n: [] for n, _ in ways}
    after_cpu = {n: [] for n, _ in ways}
    prev = None
    rounds = args.rounds
    for r in range(WARM + rounds):
        order = list(ways)
        rng.shuffle(order)
        for name, fn in order:
            t0 = time.perf_counter()
            out = fn(r)
            t1 = time.perf_counter()
            del out
            t2 = time.perf_counter()
            if r >= WARM:
                times[name].append(t2 - t0)
                held[name].append(t1 - t0)
                drops[name].append(t2 - t1)
                by_prev.setdefault((name, prev), []).append(t2 - t0)
                if prev == "torch .cpu()":
                    after_cpu[name].append(t2 - t0)
            prev = name
    lim = statistics.median(times["limit"])
    print(f"8 x 32 MiB f32 D2H (a dict), {rounds} rounds after {WARM}, order seed {seed}; "
          f"peers {'imported' if args.peers else 'not imported'}; limit {256 * MiB / lim / 1e9:.2f} GB/s (median)")
    print("medians in us: the call with its outputs' drop (as the peers bench times it), the call with")
    print("its outputs held past the timer, their drop alone; the first, after a .cpu() call and otherwise")
    print(f"{'way':<18} {'call+drop':>10} {'x limit':>8} {'held':>9} {'drop':>7} {'after .cpu() (n)':>18} {'otherwise (n)':>16}")
    for n, _ in ways:
        v = times[n]
        a = after_cpu[n]
        others = list(v)
        for x in a:
            others.remove(x)
        m = statistics.median(v)
        a_txt = f"{statistics.median(a) * 1e6:.1f} ({len(a)})" if a else "-"
        o_txt = f"{statistics.median(others) * 1e6:.1f} ({len(others)})" if others else "-"
        print(f"{n:<18} {m * 1e6:>10.1f} {lim / m:>8.3f} {statistics.median(held[n]) * 1e6:>9.1f} "
              f"{statistics.median(drops[n]) * 1e6:>7.1f} {a_txt:>18} {o_txt:>16}")

    # Session 48: each way's median call+drop by the way that ran just before it (us, with
    # the count), to see whether what came before explains the gap to the floor.
    names = [n for n, _ in ways]
    print("call+drop by the way just before (rows: the way; columns: the one before it; median us (n))")
    print(f"{'way':<16}" + "".join(f"{n[:14]:>17}" for n in names))
    for n in names:
        cells = []
        for p in names:
            v = by_prev.get((n, p))
            cells.append(f"{statistics.median(v) * 1e6:.0f} ({len(v)})" if v else "-")
        print(f"{n:<16}" + "".join(f"{c:>17}" for c in cells))

    # Phases of single pinlane calls, after a floor call, after torch's page-locked way,
    # after pinlane's own call and after a `.cpu()` call.
    befores = [("floor x1", floor(1)), ("torch pinned", torch_pinned), ("pinlane dict", pl_dict)]
    for before_name, before in befores + ([] if args.no_cpu else [("torch .cpu()", to_cpu)]):
        marks = {}
        whole_us = []
        for r in range(9):
            before(r)
            _native.trace_next_call()
            t0 = time.perf_counter()
            pl_dict(r)
            whole_us.append((time.perf_counter() - t0) * 1e6)
            for m, us in _native.last_trace() or []:
                marks.setdefault(m, []).append(us)
        print(f"pinlane dict after {before_name}: whole call median {statistics.median(whole_us):.1f} us; "
              "engine marks (median us from the engine call's start): "
              + ", ".join(f"{m} {statistics.median(v):.1f}" for m, v in marks.items()))
    print("pinlane memory_stats:", pinlane.memory_stats())


if __name__ == "__main__":
    main()
