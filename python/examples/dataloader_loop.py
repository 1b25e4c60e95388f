"""A `torch.utils.data.DataLoader` loop with pinlane in place of `pin_memory=True`
(GPU machine):

    python python/examples/dataloader_loop.py [--batches 200] [--workers 4]

Workers produce batches of 64 uint8 images (3x224x224) and labels in ordinary (pageable)
memory. The main thread moves them to the GPU and runs a small step on each, three ways
over the same loader:

* `pinlane`: `pinlane.transfer_tensor_h2d(batch)` in the loop (`pin_memory=False`);
* `pinlane.prefetch`: the next batch moved on a background thread while this one is used;
* `torch`: the loader pins (`pin_memory=True`) and the loop moves with
  `.to("cuda", non_blocking=True)`, the usual recipe.

It prints images per second for each, and checks that the three saw the same bytes (a
checksum of every image on the device). python/tests/test_integrations_gpu.py runs it
small.
"""

import argparse
import time

import torch

import pinlane


class Images(torch.utils.data.Dataset):
    """Images made cheaply (a fresh copy of one of 256 random images), so the loader is
    not what bounds the loop."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.base = torch.randint(0, 256, (256, 3, 224, 224), dtype=torch.uint8, generator=g)

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        return {"image": self.base[i % 256].clone(), "label": torch.tensor(i % 1000)}


def loader(workers, pin):
    return torch.utils.data.DataLoader(Images(), batch_size=64, num_workers=workers, pin_memory=pin,
                                       prefetch_factor=4 if workers else None)


def step(batch):
    """A small step: the checksum of the batch's bytes (a device reduction)."""
    return batch["image"].sum(dtype=torch.int64) + batch["label"].sum()


def run(way, batches, workers):
    """Moves `batches` batches `way`; returns (images per second, checksum)."""
    dev = torch.device("cuda", pinlane._native.default_device())
    it = iter(loader(workers, pin=way == "torch"))
    next(it)  # workers started, first batch made: timed from the second
    total = torch.zeros((), dtype=torch.int64, device=dev)
    torch.cuda.synchronize()
    # The clock starts before any way moves a batch (the prefetcher starts moving as soon
    # as it is made).
    t0 = time.perf_counter()
    if way == "pinlane.prefetch":
        source = (next(it) for _ in range(batches))
        moved = pinlane.prefetch(source)
    elif way == "pinlane":
        moved = (pinlane.transfer_tensor_h2d(next(it)) for _ in range(batches))
    else:
        moved = ({k: v.to(dev, non_blocking=True) for k, v in next(it).items()} for _ in range(batches))
    for batch in moved:
        total += step(batch)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    return batches * 64 / took, int(total.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    results = {}
    for way in ("pinlane", "pinlane.prefetch", "torch"):
        results[way] = run(way, args.batches, args.workers)
        print(f"{way:<18} {results[way][0]:10.0f} images/s")
    sums = {s for _, s in results.values()}
    print("same bytes everywhere:", len(sums) == 1)
    if len(sums) != 1:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
