"""Probe (session 64, not yet run: no GPU was lent): what pinlane's calls do when torch is
capturing a CUDA graph on the calling thread. A server that feeds a graph's static inputs
with `copy_into` / `Buffers` / `Pairs` must call them before `graph.replay()`, outside the
capture; this finds out what happens to one that calls them inside it. The right answers
are an error (at the call, or when the capture ends) or a graph whose replays write each
step's sources; a graph that replays without an error but writes stale bytes (a staging
slot filled once, at capture time, and reused by pinlane since) is a hole to close (a
`cuStreamIsCapturing` check of the caller's stream, refusing the call).

    bash .gpu/with-python python3 benches/probes/capture_probe.py     # on the GPU machine

Each way runs in a child process of its own (a failed capture can leave the CUDA context
unusable), and prints one line: REFUSED (where, the exception), or REPLAYS (the bytes the
replays wrote against the sources' values).
"""

import subprocess
import sys

CHILD = r"""
import sys
import torch
import pinlane

way = sys.argv[1]
dev = torch.device("cuda", 0)
n = 1 << 14  # 64 KiB of float32: staged from pageable memory, read in place from page-locked
pinned = way.endswith("pinned")
src = torch.ones(n, pin_memory=pinned)
static = torch.zeros(n, device=dev)
bufs = pinlane.Buffers([static])
pairs = pinlane.Pairs([static], [src]) if way.startswith("pairs") else None
g = torch.cuda.CUDAGraph()
pinlane.copy_into([static], [src])  # warm: the thread's streams and pools set up
torch.cuda.synchronize()
try:
    with torch.cuda.graph(g):
        if way.startswith("copy_into"):
            pinlane.copy_into([static], [src])
        elif way.startswith("buffers"):
            bufs.copy_from([src])
        elif way.startswith("pairs"):
            pairs.copy()
        elif way.startswith("d2h"):
            pinlane.transfer_tensor_d2h(static)
        elif way.startswith("h2d"):
            pinlane.transfer_tensor_h2d(src)
except Exception as e:  # noqa: BLE001 - the probe reports whatever it is
    print(f"{way}: REFUSED {type(e).__name__}: {str(e)[:200]}")
    raise SystemExit(0)
got = []
for v in (2.0, 3.0, 4.0):
    src.fill_(v)
    # Another call between replays, as a server's other requests would make.
    pinlane.copy_into([torch.zeros(n, device=dev)], [torch.full((n,), -1.0)])
    try:
        g.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(f"{way}: REFUSED at replay {type(e).__name__}: {str(e)[:200]}")
        raise SystemExit(0)
    got.append((v, float(static[0]), float(static[-1])))
ok = all(a == v and b == v for v, a, b in got) if way.startswith(("copy", "buf", "pairs")) else None
print(f"{way}: REPLAYS without an error; (source value, static[0], static[-1]) per replay {got}; "
      f"{'right' if ok else 'STALE' if ok is False else 'no static input written'}")
"""

WAYS = ["copy_into pageable", "copy_into pinned", "buffers pageable", "buffers pinned",
        "pairs pageable", "pairs pinned", "d2h", "h2d pageable"]


def main():
    for way in WAYS:
        r = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True, text=True,
                           timeout=120)
        out = (r.stdout.strip() or f"{way}: no output") + (f" (exit {r.returncode})" if r.returncode else "")
        print(out)
        if r.returncode:
            print("   stderr:", r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else "")


if __name__ == "__main__":
    main()
