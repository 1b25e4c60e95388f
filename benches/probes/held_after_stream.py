"""Probe (session 50): why small D2H calls stopped keeping the GIL after calls on a
caller's ``stream=`` (session 49, part 10). Replays that order and says, after each
phase, whether calls were held (another Python thread made no progress in most of them),
whether end flags are still on (``memory_stats()["devices"][0]["end_flags"]``; a key of
its own in session 50's run 1), the pools' counters,
and one traced call's engine marks:

    bash .gpu/with-python python3 benches/probes/held_after_stream.py   # on the GPU machine

Phases: held calls of one, two and three tensors; then calls on torch's current stream
passed as ``stream=`` (the legacy default stream); then held calls again; then calls on a
``torch.cuda.Stream`` of torch's pool; then held calls again. Prints one JSON line per
phase.
"""

import json
import statistics
import threading
import time

import torch

import pinlane
from pinlane import _native

CALLS = 21


def main():
    dev = torch.device("cuda", 0)
    spins = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            spins[0] += 1

    batches = {n: [torch.full((256,), float(n + i), device=dev) for i in range(n)] for n in (1, 2, 3)}
    pinlane.transfer_tensor_d2h(torch.zeros(4, device=dev))  # this thread's first call
    torch.cuda.synchronize(dev)
    t = threading.Thread(target=count, daemon=True)
    t.start()

    def phase(name, stream=None):
        row = {"phase": name, "stream": None if stream is None else hex(stream.cuda_stream)}
        for n, xs in batches.items():
            progress, us = [], []
            for _ in range(CALLS):
                before = spins[0]
                t0 = time.perf_counter()
                if stream is None:
                    back = pinlane.transfer_tensor_d2h(xs[0] if n == 1 else xs)
                else:
                    back = pinlane.transfer_tensor_d2h(xs[0] if n == 1 else xs, device=dev, stream=stream)
                us.append((time.perf_counter() - t0) * 1e6)
                progress.append(spins[0] - before)
            back = [back] if n == 1 else back
            assert [float(b[0]) for b in back] == [float(n + i) for i in range(n)]
            row[f"n{n}_progress_median"] = statistics.median(progress)
            row[f"n{n}_progress_zero"] = sum(p == 0 for p in progress)
            row[f"n{n}_us_median"] = round(statistics.median(us), 1)
            _native.trace_next_call()
            if stream is None:
                pinlane.transfer_tensor_d2h(xs[0] if n == 1 else xs)
            else:
                pinlane.transfer_tensor_d2h(xs[0] if n == 1 else xs, device=dev, stream=stream)
            row[f"n{n}_trace"] = [(m, round(u, 1)) for m, u in (_native.last_trace() or [])]
        s = pinlane.memory_stats()
        row["end_flags"] = s["devices"][0]["end_flags"]
        for k in ("pageable_fallbacks", "slot_waits", "retained_bytes", "background_errors"):
            row[k] = s[k]
        for k in ("pinned_outputs", "pageable_outputs", "staging"):
            row[k] = s[k]
        print(json.dumps(row), flush=True)

    try:
        phase("held, first")
        phase("on torch's current stream", torch.cuda.current_stream(dev))
        phase("held, after the current stream")
        phase("on a torch.cuda.Stream", torch.cuda.Stream(dev))
        phase("held, after a side stream")
    finally:
        stop.set()


if __name__ == "__main__":
    main()
