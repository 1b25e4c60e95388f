"""Probe (session 81): why the peers bench's 1000 x 1 KiB H2D ratio to spdl (8.2x to 8.8x
on session 80's H100s, pinlane 1.70 to 1.85 ms) is under `many_split.py`'s (12.1x,
pinlane 1.52 ms) on the same kind of host. Two suspects, in one process:

* the company a call keeps: the bench's rounds take turns among all seven ways (torch's
  1000 `.to` calls, 1000 `pin_memory()`s, tensordict), `many_split.py`'s among pinlane's
  own ways and spdl;
* Python's cyclic garbage collector: a call making 1000 output tensors (each tracked by
  the collector) sets off a young collection or more per call, and the bench's process
  holds more objects.

Phases, each 20 timed rounds of 3 calls a way after 6 warm-up rounds, the ways' order
shuffled per round (`pinlane.bench.rounds`, as the bench's `_small_rounds`), sources
rotated among 4 batches, outputs dropped in the timer, both directions:

* "all ways": every way of `pinlane.bench.ways` (the bench's row);
* "pinlane and spdl": those two alone (the probe's company);
* both again with the collector frozen first (`gc.freeze()`: what the process holds
  leaves the collections), and with it off while the calls are timed (`gc.disable()`),
  collected between phases.

Per phase: each way's median (us), pinlane's ratio to spdl and to the fastest other way,
the collections of each generation per pinlane call and the collector's time per call of
the phase (`gc.callbacks`, every way's calls together).

    bash .gpu/with-python python3 benches/probes/mix_gc.py    # on the GPU machine
"""

import gc
import statistics
import time

import torch

from pinlane.bench import _each, pattern, rounds, same, ways

N, SETS, BLOCK, COUNT = 1000, 4, 3, 20


class GcClock:
    """Collections per generation and their time, from `gc.callbacks`."""

    def __init__(self):
        self.count = [0, 0, 0]
        self.seconds = 0.0
        self._t0 = None
        gc.callbacks.append(self._hook)

    def _hook(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.count[info["generation"]] += 1
            self._t0 = None

    def reset(self):
        self.count = [0, 0, 0]
        self.seconds = 0.0


def phase(label, calls, seed, clock, mode):
    gc.collect()
    if mode == "frozen":
        gc.freeze()
    clock.reset()
    if mode == "off":
        gc.disable()
    try:
        got = rounds(calls, seed, BLOCK)
    finally:
        gc.enable()
        if mode == "frozen":
            gc.unfreeze()
    med = {name: statistics.median(v) * 1e6 for name, (v, _) in got.items()}
    total = sum(len(v) for v, _ in got.values())
    mine = med["pinlane"]
    others = {k: v for k, v in med.items() if k != "pinlane"}
    best = min(others, key=others.get)
    spdl = f"{med['spdl'] / mine:5.2f}x spdl" if "spdl" in med else "no spdl"
    print(f"  {label:<34} pinlane {mine:8.1f} us; {spdl}; {others[best] / mine:5.2f}x "
          f"the fastest other ({best}); gc gens {[round(c / total, 2) for c in clock.count]} "
          f"a call, {clock.seconds / total * 1e6:6.1f} us a call; objects tracked {len(gc.get_objects())}")
    for name in sorted(med, key=med.get):
        print(f"      {name:<28} {med[name]:9.1f}")


def main():
    dev = torch.device("cuda:0")
    clock = GcClock()
    sources = [[pattern(torch, (256,), torch.float32, s * 10000 + i) for i in range(N)] for s in range(SETS)]
    shared = [_each(s, lambda t: t.to(dev)) for s in sources]
    torch.cuda.synchronize()
    every = ways(torch, dev)
    for name, (h2d, d2h) in every.items():
        assert same(torch, h2d(sources[0]), sources[0]), f"{name} H2D"
        if d2h is not None:
            assert same(torch, d2h(shared[0]), sources[0]), f"{name} D2H"
    torch.cuda.synchronize()

    def rotating(fn, inputs):
        turn = iter(range(1 << 30))
        return lambda _: fn(inputs[next(turn) % SETS])

    for direction in ("H2D", "D2H"):
        inputs = sources if direction == "H2D" else shared
        pick = 0 if direction == "H2D" else 1
        all_calls = [(n, rotating(w[pick], inputs), COUNT) for n, w in every.items() if w[pick] is not None]
        two = [c for c in all_calls if c[0] in ("pinlane", "spdl")]
        print(f"\n{direction}, 1000 x 1 KiB f32 (medians of {COUNT * BLOCK} calls a way)")
        seed = 81
        for label, calls, mode in [
            ("all ways", all_calls, "on"),
            ("pinlane and spdl", two, "on"),
            ("all ways, gc frozen", all_calls, "frozen"),
            ("pinlane and spdl, gc frozen", two, "frozen"),
            ("all ways, gc off", all_calls, "off"),
            ("pinlane and spdl, gc off", two, "off"),
            ("all ways (again)", all_calls, "on"),
            ("pinlane and spdl (again)", two, "on"),
        ]:
            seed += 1
            phase(label, calls, seed, clock, mode)


if __name__ == "__main__":
    main()
