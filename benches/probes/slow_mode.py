"""Probe (session 50): what a slow process does differently. The peers bench's 1000 x
1 KiB rows take ~1.4 ms a call in some processes and ~2.3 ms in others, torch's own
per-tensor work with them (session 34: "a slow process is slow at all CPU work"). Each
process here times the same work and says, per call, what the kernel saw:

    for i in $(seq 6); do bash .gpu/with-python python3 benches/probes/slow_mode.py; done

One JSON line per process. For each piece of work (median of 40 calls after 5 warm-up
calls): wall us a call; CPU us a call (`time.thread_time`: below wall when the thread was
off the CPU); minor page faults a call (`getrusage`: the heap given back to the kernel
and faulted in again each call would show here); voluntary and involuntary context
switches a call; and the run-queue wait per call from /proc/thread-self/schedstat (time
runnable but not running: another thread or the host on this vCPU). Pieces: pinlane's H2D
and D2H of 1000 x 1 KiB, torch's `unbind(0)` of a [1000, 256] tensor with the drop of its
views, a pure-Python loop (no torch, no allocation of note), and a loop of 1000 small
`bytearray`s (allocation alone).
"""

import json
import os
import resource
import statistics
import time

import torch

import pinlane


def schedstat():
    try:
        with open("/proc/thread-self/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except OSError:
        return 0, 0


def measure(fn, reps=40, warm=5):
    for _ in range(warm):
        fn()
    walls, cpus = [], []
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    s0 = schedstat()
    for _ in range(reps):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    s1 = schedstat()
    return {
        "wall_us": round(statistics.median(walls) * 1e6, 1),
        "cpu_us": round(statistics.median(cpus) * 1e6, 1),
        "minflt": round((r1.ru_minflt - r0.ru_minflt) / reps, 1),
        "nvcsw": round((r1.ru_nvcsw - r0.ru_nvcsw) / reps, 2),
        "nivcsw": round((r1.ru_nivcsw - r0.ru_nivcsw) / reps, 2),
        "runq_wait_us": round((s1[1] - s0[1]) / reps / 1e3, 1),
    }


def py_loop():
    x = 0
    for i in range(20000):
        x += i & 7
    return x


def allocs():
    return [bytearray(300) for _ in range(1000)]


def main():
    with open("/proc/self/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    srcs = [torch.full((256,), float(i)) for i in range(1000)]
    on = pinlane.transfer_tensor_h2d(srcs)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(pinlane.transfer_tensor_d2h(on), srcs))
    big = torch.zeros(1000, 256)
    row = {"cpu": cpu, "pid": os.getpid()}
    row["pinlane_h2d"] = measure(lambda: pinlane.transfer_tensor_h2d(srcs))
    row["pinlane_d2h"] = measure(lambda: pinlane.transfer_tensor_d2h(on))
    row["torch_unbind"] = measure(lambda: big.unbind(0))
    row["py_loop"] = measure(py_loop)
    row["allocs"] = measure(allocs)
    with open("/proc/self/stat") as f:
        row["cpu_end"] = int(f.read().rsplit(")", 1)[1].split()[36])
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
