"""Probe (session 49): why the peers bench (`pinlane.bench`, each way timed in a block of
its own) sees one 1 KiB D2H at 1.19x to 1.21x torch's `.to("cpu")` where the same calls
taking turns in rounds see 1.31x to 1.35x (benches/probes/one_d2h_split.py).

    bash .gpu/with-python python3 benches/probes/blocks_order.py     # on the GPU machine

The bench's own `timed` (WARMUPS calls, then the median of REPS), its ways and sources
(four lists of one tensor in turn), in orders: as the bench runs them (each library's H2D
block, then its D2H block), D2H blocks alone, and D2H blocks of 2,000 calls; each order
twice. Medians, us.
"""

import torch

import pinlane
from pinlane.bench import pattern, timed, ways

REPS = 100


def main():
    dev = torch.device("cuda", 0)
    w = ways(torch, dev, log=lambda m: None)
    w = {k: w[k] for k in ("pinlane", "torch .to")}
    sources = [[pattern(torch, (256,), torch.float32, s)] for s in range(4)]
    ons = {k: [h(s) for s in sources] for k, (h, _) in w.items()}
    torch.cuda.synchronize()

    def d2h(lib, reps=REPS):
        return timed(reps, lambda r: w[lib][1](ons[lib][r % 4])) * 1e6

    def h2d(lib):
        return timed(REPS, lambda r: w[lib][0](sources[r % 4])) * 1e6

    for k in range(2):
        got = {}
        for lib in w:  # as the bench: H2D block, then D2H block, library after library
            h2d(lib)
            got[lib] = d2h(lib)
        alone = {lib: d2h(lib) for lib in w}
        long = {lib: d2h(lib, 2000) for lib in w}
        for name, g in (("as the bench", got), ("D2H blocks alone", alone), ("D2H blocks of 2000", long)):
            print(f"{k}: {name:20s} pinlane {g['pinlane']:6.2f}  torch .to {g['torch .to']:6.2f}  "
                  f"ratio {g['torch .to'] / g['pinlane']:.3f}x")
    print("pinlane", pinlane.__file__)


if __name__ == "__main__":
    main()
