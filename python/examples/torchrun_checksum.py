"""One process per GPU with `torchrun`: each rank moves its batches with pinlane to
`cuda:{LOCAL_RANK}` and proves the bytes exact with an NCCL all-reduce (GPU machine):

    torchrun --standalone --nproc_per_node=N python/examples/torchrun_checksum.py

`torchrun` sets `LOCAL_RANK` for each process, and pinlane's calls go to
`cuda:{LOCAL_RANK}` without being told. Each rank makes its own batches (seeded by rank
and step, in pageable memory), sums every byte on the host (the expected checksum) and on
the device after `pinlane.transfer_tensor_h2d` (the received checksum), then moves the
device tensors back with `pinlane.transfer_tensor_d2h` and sums those too. The sums, and
whether each rank's agree, are all-reduced over NCCL; rank 0 prints them, and every rank
exits 1 if any rank saw a difference.
"""

import os

import torch
import torch.distributed as dist

import pinlane


def batch(rank, step):
    g = torch.Generator().manual_seed(rank * 1000 + step)
    return {
        "image": torch.randint(0, 256, (16, 3, 64, 64), dtype=torch.uint8, generator=g),
        "tokens": torch.randint(0, 50000, (16, 128), dtype=torch.int64, generator=g),
        "extra": [torch.randn(1000, generator=g) for _ in range(3)],
    }


def byte_sum(tensors):
    """The sum of every byte, as int64 on the tensors' device."""
    return sum(t.contiguous().view(torch.uint8).sum(dtype=torch.int64) for t in tensors)


def leaves(b):
    return [b["image"], b["tokens"], *b["extra"]]


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local_rank)
    expected = torch.zeros((), dtype=torch.int64)
    received = torch.zeros((), dtype=torch.int64, device=dev)
    back_sum = torch.zeros((), dtype=torch.int64)
    for step in range(20):
        b = batch(rank, step)
        expected += byte_sum(leaves(b))
        on = pinlane.transfer_tensor_h2d(b)
        assert all(t.device == dev for t in leaves(on)), "not on cuda:{LOCAL_RANK}"
        received += byte_sum(leaves(on))
        back_sum += byte_sum(leaves(pinlane.transfer_tensor_d2h(on)))
    mine_ok = bool(expected == received.cpu()) and bool(expected == back_sum)
    sums = torch.stack([expected, received.cpu(), back_sum, torch.tensor(0 if mine_ok else 1)]).to(dev)
    dist.all_reduce(sums)  # each rank's sums, and how many ranks saw a difference
    ok = int(sums[3]) == 0
    if rank == 0:
        print(f"{world} rank(s): expected {int(sums[0])}, received {int(sums[1])}, back {int(sums[2])}, "
              f"ranks with a difference {int(sums[3])}: {'exact' if ok else 'DIFFERENT'}")
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
