"""Why whole processes differ: the same per-tensor work timed in several processes, each
with the CPU it ran on and that CPU's NUMA node (the peers bench's 1000 x 1 KiB row took
~1.5 ms in some processes and ~2.5 ms in others on one host, sessions 33 and 34).

    for i in $(seq 8); do bash .gpu/with-python python3 benches/probes/process_spread.py; done

One line per process: the CPU and node at the start and the end, then medians of 40 calls
after 5 warm-up calls: pinlane's H2D of 1000 x 1 KiB (CPU sources), torch's `unbind(0)`
of a [1000, 256] tensor (torch's per-tensor work alone), and one 1 KiB `t.to("cuda")`.
"""

import glob
import os
import statistics
import time

import torch

import pinlane


def where():
    with open("/proc/self/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    nodes = glob.glob(f"/sys/devices/system/cpu/cpu{cpu}/node*")
    return cpu, (os.path.basename(nodes[0])[4:] if nodes else "?")


def median_us(fn, reps=40, warm=5):
    for _ in range(warm):
        fn()
    v = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        v.append(time.perf_counter() - t0)
    return statistics.median(v) * 1e6


def main():
    start = where()
    srcs = [torch.full((256,), float(i)) for i in range(1000)]
    big = torch.zeros(1000, 256)
    one = torch.ones(256)
    pinlane.transfer_tensor_h2d(srcs)
    h2d = median_us(lambda: pinlane.transfer_tensor_h2d(srcs))
    unbind = median_us(lambda: big.unbind(0))
    to = median_us(lambda: (one.to("cuda"), torch.cuda.synchronize()))
    print(f"cpu {start[0]} node {start[1]} -> cpu {where()[0]} node {where()[1]}: "
          f"pinlane 1000 x 1 KiB H2D {h2d:.0f} us, torch unbind(0) of 1000 rows {unbind:.0f} us, "
          f"one t.to('cuda') + sync {to:.1f} us, affinity {len(os.sched_getaffinity(0))} cpus")


if __name__ == "__main__":
    main()
