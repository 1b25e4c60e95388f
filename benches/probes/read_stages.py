"""Probe (session 84): what the binding's H2D costs a tensor to read its inputs, on a
machine WITHOUT a CUDA driver (a CPU build of torch 2.10 or newer is enough).

There `_native.h2d(tensors, device=0, consumer_stream=0)` reads every tensor (the loop
that decides, per tensor, whether pinlane or torch moves it, and takes torch's
non-owning view of the plain ones) and then fails at `Stream::from_raw` (no driver):
the whole call times the reading, the failed stream import and the drop of the views.
With the instrumented build of benches/results/session84/read_stages.patch,
PROBE_STAGE=0..4 stops each tensor's reading early (0: nothing; 1: `requires_grad`;
2: and the subclass check; 3: and torch's view; 4: 2 and `is_neg` asked from Rust),
and PROBE_ZST=1 gives the views no owner.

    python benches/probes/read_stages.py [N_TENSORS] [REPS]
"""
import sys
import time

import torch

import pinlane  # noqa: F401  (the extension's Python half)
from pinlane import _native

if torch.cuda.is_available():
    sys.exit("read_stages.py: for a machine without CUDA (here the call would transfer)")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
ts = [torch.randn(256) for _ in range(n)]


def once():
    try:
        _native.h2d(ts, num_caches=4, device=0, consumer_stream=0, maybe_neg=False)
    except RuntimeError as e:
        return e
    return None


print(repr(once())[:200])
for _ in range(20):
    once()
took = []
for _ in range(reps):
    t0 = time.perf_counter_ns()
    once()
    took.append(time.perf_counter_ns() - t0)
took.sort()
print(f"{n} tensors: median {took[len(took) // 2] / 1e3:.1f} us, min {took[0] / 1e3:.1f} us")
t0 = time.perf_counter_ns()
for _ in range(reps):
    for t in ts:
        t.requires_grad
print(f"requires_grad from Python: {(time.perf_counter_ns() - t0) / reps / n:.1f} ns/tensor")
t0 = time.perf_counter_ns()
for _ in range(reps):
    any(map(torch.Tensor.is_neg, ts))
print(f"any(map(Tensor.is_neg)) from Python: {(time.perf_counter_ns() - t0) / reps / n:.1f} ns/tensor")
