"""Why 1000 x 1 KiB moves in ~1.7 ms in py_overhead's warm loop and ~2.7 ms in the peers
bench (benches/spdl_compare.py): the same call timed the ways the two benches differ.

    bash .gpu/with-python python3 benches/probes/many_small.py     # on the GPU machine

Each row is the median of 60 whole calls after 6 warm-up calls, as pinlane.bench times
them (the result dropped inside the timed loop), in one process:

* one source, used every call (py_overhead);
* four sources in turn (spdl_compare: each call reads a batch the last three did not);
* four sources, the cyclic garbage collector off while timing;
* four sources, with the bench's other live objects around: the results of the first
  call for each source kept, as spdl_compare keeps them for its D2H rows.

spdl's H2D of the same batches is timed the same ways when spdl is installed (the
denominator of the "10x spdl" target moves with the same conditions).
"""

import gc
import statistics
import time

import torch

import pinlane

REPS, WARMUPS = 60, 6


def median_us(fn, n_sources):
    for w in range(WARMUPS):
        fn(w % n_sources)
    v = []
    for r in range(REPS):
        t0 = time.perf_counter()
        fn(r % n_sources)
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def ways():
    out = {"pinlane": lambda b: pinlane.transfer_tensor_h2d(b)}
    try:
        from spdl.io import transfer_tensor_h2d

        out["spdl"] = transfer_tensor_h2d
    except ImportError:
        pass
    return out


def main():
    sources = [[torch.randn(256) for _ in range(1000)] for _ in range(4)]
    for name, h2d in ways().items():
        rows = []
        rows.append(("one source", median_us(lambda r: h2d(sources[0]), 1)))
        rows.append(("four sources in turn", median_us(lambda r: h2d(sources[r]), 4)))
        gc.disable()
        try:
            rows.append(("four sources, gc off", median_us(lambda r: h2d(sources[r]), 4)))
        finally:
            gc.enable()
        kept = [h2d(s) for s in sources]
        torch.cuda.synchronize()
        rows.append(("four sources, first results kept", median_us(lambda r: h2d(sources[r]), 4)))
        del kept
        for what, us in rows:
            print(f"{name:<8} 1000 x 1 KiB H2D, {what:<36} {us:9.1f} us")
        print(f"{name:<8} gc counts now {gc.get_count()}, thresholds {gc.get_threshold()}")


if __name__ == "__main__":
    main()
