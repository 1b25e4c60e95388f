"""Probe (session 82): 8 x 32 MiB f32 H2D from pageable memory, pinlane's staging ring
against torch's per-tensor pipeline (`t.pin_memory().to(dev, non_blocking=True)` per
tensor: each tensor copied into page-locked memory while the previous one crosses the
link), in one process, with the pieces of torch's way timed alone:

    bash .gpu/with-python python3 benches/probes/pipe_8x32.py [--threads N]   # GPU machine

`--threads N`: pinlane's copy threads (`pinlane.configure(copy_threads=N)`; default: 3/4
of the cores, at most 12). Ways, taking turns (`pinlane.bench.rounds`, order shuffled per
round, sources rotated among 3 batches, outputs dropped inside the timer):

* pinlane: `transfer_tensor_h2d(batch)`;
* torch pinned: the per-tensor pipeline above, then `torch.cuda.synchronize()`;
* torch pin_memory alone: `t.pin_memory()` of every tensor (the host copies of torch's
  way, no DMA: its fill rate, with torch's `get_num_threads()` threads);
* floor: one 256 MiB copy from page-locked memory (the limit, in the same rounds).

Prints each way's median (us), its fraction of the floor's rate and CPU s/GB.
"""

import argparse
import statistics

import torch

import pinlane
from pinlane.bench import rounds
from pinlane.testing import patterned

ROUNDS = 15
N, MIB32 = 8, 8 << 20  # 8 tensors of 8 Mi f32 elements (32 MiB)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads is not None:
        pinlane.configure(copy_threads=args.threads)
    dev = torch.device("cuda:0")
    sets = [{f"t{i}": patterned(torch.float32, (MIB32,), s * 10 + i) for i in range(N)} for s in range(3)]
    nbytes = N * MIB32 * 4
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    host.fill_(3)
    floor_dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    # Every way's bytes, checked once (as bytes: the random patterns hold NaNs).
    def same(a, b):
        return all(torch.equal(a[k].cpu().view(torch.uint8), v.view(torch.uint8)) for k, v in b.items())

    assert same(pinlane.transfer_tensor_h2d(sets[0]), sets[0]), "pinlane"
    got = {k: v.pin_memory().to(dev, non_blocking=True) for k, v in sets[0].items()}
    torch.cuda.synchronize()
    assert same(got, sets[0]), "torch pinned"
    del got

    def pinlane_way(r):
        out = pinlane.transfer_tensor_h2d(sets[r % 3])
        del out

    def torch_pinned(r):
        out = {k: v.pin_memory().to(dev, non_blocking=True) for k, v in sets[r % 3].items()}
        torch.cuda.synchronize()
        del out

    def pin_alone(r):
        out = [v.pin_memory() for v in sets[r % 3].values()]
        del out

    def floor(r):
        floor_dst.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

    ways = [("pinlane", pinlane_way, ROUNDS), ("torch pinned", torch_pinned, ROUNDS),
            ("torch pin_memory alone", pin_alone, ROUNDS), ("floor (page-locked copy)", floor, ROUNDS)]
    got = rounds(ways, seed=82)
    floor_s = statistics.median(got["floor (page-locked copy)"][0])
    print(f"copy threads: {args.threads or 'default'}; torch threads: {torch.get_num_threads()}; "
          f"limit {nbytes / floor_s / 1e9:.1f} GB/s")
    for name, _, _ in ways:
        times, cpu = got[name]
        med = statistics.median(times)
        print(f"  {name:<26} {med * 1e6:9.1f} us  {floor_s / med:6.3f} of the limit  "
              f"{cpu / (nbytes / 1e9):6.3f} CPU s/GB  (min {min(times) * 1e6:.1f}, max {max(times) * 1e6:.1f})")


if __name__ == "__main__":
    main()
