"""Probe (session 53): a list of one tensor, the peers bench's one-tensor batch, through
the public calls now (the list opened inline, `_native.d2h_one` / `h2d_one` called
directly) against the way before session 53 (two Python helpers around the same native
call: `_plain_one` found the tensor, `_rewrapped` put the output back in a list), and
against torch's own calls, in one process:

    bash .gpu/with-python python3 benches/probes/one_list_ab.py    # on the GPU machine

The ways take turns with `pinlane.bench.rounds` (ROUNDS rounds, each way BLOCK calls in
a row per round, the order shuffled per round, sources rotated among 8 batches as the
bench does); medians of every timed call (us). Every way's result is checked once.
"""

import statistics

import torch

import pinlane
from pinlane import _native
from pinlane.bench import rounds

ROUNDS, BLOCK, SETS = 40, 20, 8


def _plain_one(batch):
    # Before session 53 (pinlane/__init__.py at f5481d4), verbatim but for the docstring.
    T = pinlane._Tensor
    t = type(batch)
    if t is T:
        one = batch
    elif (t is list or t is tuple) and len(batch) == 1 and T is not None:
        one = batch[0]
        if type(one) is not T:
            return None
    else:
        return None
    return None if one.is_neg() else one


def _rewrapped(batch, one, out):
    # As pinlane/__init__.py has it (the general path still uses it).
    if batch is one:
        return out
    if out is one:
        return batch
    return [out] if type(batch) is list else (out,)


def old_d2h(batch, device):
    # The list-of-one part of transfer_tensor_d2h before session 53.
    if type(batch) is pinlane._Tensor and not batch.is_neg():
        return _native.d2h_one(batch, device)
    one = _plain_one(batch)
    return _rewrapped(batch, one, _native.d2h_one(one, device))


def old_h2d(batch, num_caches=4):
    if type(batch) is pinlane._Tensor and not batch.is_neg():
        return _native.h2d_one(batch, num_caches)
    one = _plain_one(batch)
    return _rewrapped(batch, one, _native.h2d_one(one, num_caches))


def main():
    dev = torch.device("cuda", 0)
    device = str(dev)
    srcs = [[torch.full((256,), float(i))] for i in range(SETS)]
    ons = [[s[0].to(dev)] for s in srcs]
    torch.cuda.synchronize()
    for way in (lambda b: pinlane.transfer_tensor_d2h(b, device=device), lambda b: old_d2h(b, device)):
        out = way(ons[3])
        assert type(out) is list and len(out) == 1 and torch.equal(out[0], srcs[3][0])
    for way in (pinlane.transfer_tensor_h2d, old_h2d):
        out = way(srcs[5])
        assert type(out) is list and len(out) == 1 and torch.equal(out[0].cpu(), srcs[5][0])

    def synced(fn):
        def call(b):
            out = fn(b)
            torch.cuda.synchronize()
            return out
        return call

    rows = {
        "D2H": [
            ("pinlane now", lambda r: pinlane.transfer_tensor_d2h(ons[r % SETS], device=device)),
            ("pinlane before", lambda r: old_d2h(ons[r % SETS], device)),
            ("torch .cpu()", lambda r: [t.cpu() for t in ons[r % SETS]]),
        ],
        "H2D": [
            ("pinlane now", lambda r: pinlane.transfer_tensor_h2d(srcs[r % SETS])),
            ("pinlane before", lambda r: old_h2d(srcs[r % SETS])),
            ("torch .to", lambda r: synced(lambda b: [t.to(dev) for t in b])(srcs[r % SETS])),
        ],
    }
    for direction, ways in rows.items():
        got = rounds([(n, fn, ROUNDS) for n, fn in ways], seed=53, block=BLOCK)
        med = {n: statistics.median(v) * 1e6 for n, (v, _) in got.items()}
        now, before = med["pinlane now"], med["pinlane before"]
        other = [n for n in med if not n.startswith("pinlane")][0]
        print(f"[1 KiB] {direction}: now {now:.2f} us, before {before:.2f} us (saved {before - now:+.2f}); "
              f"{other} {med[other]:.2f} us: {med[other] / now:.3f}x now, {med[other] / before:.3f}x before")


if __name__ == "__main__":
    main()
