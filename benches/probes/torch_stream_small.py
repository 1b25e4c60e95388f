"""Probe (session 70): one small H2D from Python with a `torch.cuda.Stream` current (a
borrowed consumer stream), the kept device blocks on and off, against torch's own way on
that stream. Run once per setting, in turn:

    python3 -c "import pinlane, runpy, sys; pinlane.configure(small_device_blocks=0); \
        sys.argv=['x', 'off']; runpy.run_path('benches/probes/torch_stream_small.py', run_name='__main__')"

Rows (medians over ROUNDS rounds of each round's median of CALLS whole calls, us, the ways
taking turns round by round; outputs dropped inside the timer, so their blocks are given
back on the stream): pinlane's `transfer_tensor_h2d` of one 1 KiB tensor and of a dict of
two, and torch's `t.to("cuda")` followed by `s.synchronize()` (pinlane's call returns with
the data on the device, usable on any stream), all under `with torch.cuda.stream(s)`.
Each way's result is checked once, doubled on `s`. A kernel has run on `s` before any
timing (every torch program launches some: it slows the driver's pool check, session 69).
`kept` is `memory_stats()["kept_device_block_bytes"]` after the rows.
"""

import statistics
import sys
import time

import torch

import pinlane

ROUNDS, CALLS = 15, 200


def timed(fn):
    v = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "?"
    s = torch.cuda.Stream()
    h = torch.arange(256, dtype=torch.float32)
    pair = {"a": h, "b": h + 1}
    with torch.cuda.stream(s):
        x = torch.ones(1024, device="cuda") * 3  # a kernel on s
        out = pinlane.transfer_tensor_h2d(h)
        assert torch.equal((out * 2).cpu(), h * 2)
        two = pinlane.transfer_tensor_h2d(pair)
        assert torch.equal((two["b"] * 2).cpu(), (h + 1) * 2)
        del out, two, x

        def torch_way():
            t = h.to("cuda")
            s.synchronize()
            return t

        assert torch.equal((torch_way() * 2).cpu(), h * 2)
        ways = [
            ("pinlane 1 KiB", lambda: pinlane.transfer_tensor_h2d(h)),
            ("pinlane dict of 2", lambda: pinlane.transfer_tensor_h2d(pair)),
            ("torch .to + sync", torch_way),
        ]
        for _, fn in ways:
            for _ in range(100):
                fn()
        got = {n: [] for n, _ in ways}
        for _ in range(ROUNDS):
            for n, fn in ways:
                got[n].append(timed(fn))
        s.synchronize()
    kept = pinlane.memory_stats()["kept_device_block_bytes"]
    cells = "  ".join(f"{n} {statistics.median(v):7.2f}" for n, v in got.items())
    print(f"=== {tag}: {cells}  kept {kept}")


if __name__ == "__main__":
    main()
