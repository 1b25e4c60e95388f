"""Model weights to the GPU: a generated safetensors checkpoint (4 GiB, 291 tensors, a
model's mix of bf16/f16/f32 matrices and small norms), page cache warm, loaded every way
a user would pick, in one process on the GPU machine.

    bash .gpu/with-python python3 benches/weights.py [--json OUT] [--reps N] [--dir D]

Ways (each ends with the tensors on the device, `torch.cuda.synchronize()`d):

* ``safetensors load_file(device)``: ``safetensors.torch.load_file(path, device="cuda:0")``;
* ``load_file then .to``: ``load_file(path)`` to the CPU, then ``.to("cuda:0")`` per tensor;
* ``mmap views, pin_memory().to``: ``torch.frombuffer`` views of a mapping of the file,
  then ``pin_memory().to(dev, non_blocking=True)`` per tensor;
* ``load_file then pinlane h2d``: ``load_file(path)``, then ``pinlane.transfer_tensor_h2d``;
* ``mmap views, pinlane h2d``: the views, then ``pinlane.transfer_tensor_h2d``;
* ``pinlane load_safetensors``: ``pinlane.load_safetensors(path)``, and the same checkpoint
  in 4 shards with an index (``sharded``).

Every way's result is checked tensor by tensor against the file (``load_file`` to the
CPU, compared on the device, ``torch.equal``) once, after its timed calls. Whole calls
are timed: median of ``--reps`` after one warm-up. Prints ms, GB/s, the fraction of the
page-locked limit (one 256 MiB copy, measured in this process) and the CPU seconds per
GB (process CPU time, all threads). With ``--first``, each way's first call in a fresh
process (torch's CUDA set up first, as a server's is by then; pinlane's first transfer's
phases printed): what a server's start pays. Then a cold read: the files' pages dropped from the
page cache (``posix_fadvise(DONTNEED)``), one load each of safetensors' loader and
pinlane's, bounded by the disk.
"""

import argparse
import json
import mmap
import os
import statistics
import sys
import time

import torch

import pinlane
from pinlane.bench import limits

DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def model(h=2048, inter=7680, layers=32, vocab=32000):
    """Names and (shape, dtype) of a decoder's weights: 32 x 9 + 3 = 291 tensors."""
    out = {"model.embed_tokens.weight": ((vocab, h), torch.bfloat16)}
    for k in range(layers):
        p = f"model.layers.{k}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{n}.weight"] = ((h, h), torch.bfloat16)
        out[p + "mlp.gate_proj.weight"] = ((inter, h), torch.bfloat16)
        out[p + "mlp.up_proj.weight"] = ((inter, h), torch.bfloat16)
        out[p + "mlp.down_proj.weight"] = ((h, inter), torch.float16)
        out[p + "input_layernorm.weight"] = ((h,), torch.float32)
        out[p + "post_attention_layernorm.weight"] = ((h,), torch.float32)
    out["model.norm.weight"] = ((h,), torch.float32)
    out["lm_head.weight"] = ((vocab, h), torch.bfloat16)
    return out


def write(d):
    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    one, sharded = f"{d}/model.safetensors", f"{d}/sharded"
    if os.path.exists(one) and os.path.exists(f"{sharded}/model.safetensors.index.json"):
        return one, sharded
    torch.manual_seed(0)
    ts = {n: torch.empty(s, dtype=t).uniform_(-1, 1) for n, (s, t) in model().items()}
    save_file(ts, one)
    os.makedirs(sharded, exist_ok=True)
    names = list(ts)
    parts = [names[i::4] for i in range(4)]
    wm = {}
    for k, part in enumerate(parts):
        f = f"model-{k + 1:05}-of-00004.safetensors"
        save_file({n: ts[n] for n in part}, f"{sharded}/{f}")
        wm.update({n: f for n in part})
    with open(f"{sharded}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    return one, sharded


def files_of(path):
    if os.path.isdir(path):
        return [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
    return [path]


def warm(path):
    for f in files_of(path):
        with open(f, "rb") as fh:
            while fh.read(1 << 26):
                pass


def drop(path):
    for f in files_of(path):
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def views(path):
    """`torch.frombuffer` views of a mapping of the file, as a user would make them."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    header.pop("__metadata__", None)
    base, out = 8 + n, {}
    for k, v in header.items():
        s, e = v["data_offsets"]
        t = torch.frombuffer(m, dtype=torch.uint8, count=e - s, offset=base + s) if e > s else torch.empty(0, dtype=torch.uint8)
        out[k] = t.view(DT[v["dtype"]]).view(v["shape"])
    return out


def make_ways(path, sharded, dev):
    from safetensors.torch import load_file

    def sync(d):
        torch.cuda.synchronize()
        return d

    return {
        "safetensors load_file(device)": lambda: sync(load_file(path, device="cuda:0")),
        "load_file then .to": lambda: sync({k: v.to(dev) for k, v in load_file(path).items()}),
        "mmap views, pin_memory().to": lambda: sync(
            {k: v.pin_memory().to(dev, non_blocking=True) for k, v in views(path).items()}
        ),
        "load_file then pinlane h2d": lambda: pinlane.transfer_tensor_h2d(load_file(path), num_caches=0),
        "mmap views, pinlane h2d": lambda: pinlane.transfer_tensor_h2d(views(path), num_caches=0),
        "pinlane load_safetensors": lambda: pinlane.load_safetensors(path),
        "pinlane load_safetensors, sharded": lambda: pinlane.load_safetensors(sharded),
    }


def first_call(way, d):
    """`--one`: the first call of `way` in this fresh process, after torch has set CUDA up
    (as a server has by then) and the page cache holds the files; pinlane's ways also
    give the phases of their first transfer call."""
    dev = torch.device("cuda:0")
    torch.cuda.init()
    torch.empty(1, device=dev)
    path, sharded = f"{d}/model.safetensors", f"{d}/sharded"
    warm(sharded if "sharded" in way else path)
    fn = make_ways(path, sharded, dev)[way]
    if "pinlane" in way:
        pinlane._native.trace_next_call()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    trace = pinlane._native.last_trace() if "pinlane" in way else None
    print(json.dumps(dict(way=way, first_ms=dt * 1e3, n=len(out), trace=trace)))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/pinlane-weights")
    ap.add_argument("--first", action="store_true",
                    help="also time each way's first call in a fresh process (a server's start)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message=".*not writable.*")
    if args.one:
        return first_call(args.one, args.dir)
    from safetensors.torch import load_file

    dev = torch.device("cuda:0")
    torch.cuda.init()
    t0 = time.perf_counter()
    path, sharded = write(args.dir)
    print(f"checkpoint written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    nbytes = sum(os.path.getsize(f) for f in files_of(path))
    data_bytes = sum(t.numel() * t.element_size() for t in load_file(path).values())
    lim = limits(torch, dev)[0]
    ref = {k: v.to(dev) for k, v in load_file(path).items()}
    torch.cuda.synchronize()

    ways = make_ways(path, sharded, dev)
    rows = []
    for name, fn in ways.items():
        warm(sharded if "sharded" in name else path)
        fn()  # warm-up
        times, cpus = [], []
        for _ in range(args.reps):
            c0, t0 = time.process_time(), time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            del out
        got = fn()
        ok = set(got) == set(ref) and all(
            got[k].device == dev and got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in ref.items()
        )
        del got
        m = statistics.median(times)
        rows.append(
            dict(way=name, bytes=data_bytes, median_ms=m * 1e3, best_ms=min(times) * 1e3, gbs=data_bytes / m / 1e9,
                 fraction_of_limit=data_bytes / m / 1e9 / lim, cpu_s_per_gb=statistics.median(cpus) / (data_bytes / 1e9),
                 checked=ok, times_ms=[t * 1e3 for t in times])
        )
        r = rows[-1]
        print(f"{name:36s} {r['median_ms']:8.1f} ms {r['gbs']:6.1f} GB/s {r['fraction_of_limit']:.3f} x limit "
              f"{r['cpu_s_per_gb']:.3f} CPU-s/GB  checked={ok}", flush=True)
        if not ok:
            print(f"MISMATCH: {name}", file=sys.stderr)
    cold = []
    for name in ("safetensors load_file(device)", "pinlane load_safetensors"):
        drop(path)
        t0 = time.perf_counter()
        out = ways[name]()
        dt = time.perf_counter() - t0
        del out
        cold.append(dict(way=name, ms=dt * 1e3, gbs=data_bytes / dt / 1e9))
        print(f"cold: {name:30s} {dt * 1e3:8.1f} ms {data_bytes / dt / 1e9:6.2f} GB/s", flush=True)
    first = []
    if args.first:
        import subprocess

        for name in ways:
            r = subprocess.run([sys.executable, __file__, "--one", name, "--dir", args.dir],
                               capture_output=True, text=True)
            try:
                first.append(json.loads(r.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError):
                first.append(dict(way=name, error=r.stderr[-500:]))
            f = first[-1]
            print(f"first call, fresh process: {name:36s} " + (f"{f['first_ms']:8.1f} ms" if "first_ms" in f else f["error"]),
                  flush=True)
    st = next(r for r in rows if r["way"] == "safetensors load_file(device)")
    pl = next(r for r in rows if r["way"] == "pinlane load_safetensors")
    print(f"\n{torch.cuda.get_device_name(dev)}; page-locked limit H2D {lim:.1f} GB/s; checkpoint "
          f"{data_bytes / 2**30:.2f} GiB of tensors ({len(ref)}), file {nbytes / 2**30:.2f} GiB")
    print("| way | ms | GB/s | x limit | CPU-s/GB | checked |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['way']} | {r['median_ms']:.1f} | {r['gbs']:.1f} | {r['fraction_of_limit']:.3f} | "
              f"{r['cpu_s_per_gb']:.3f} | {r['checked']} |")
    print(f"pinlane load_safetensors / safetensors load_file(device): {st['median_ms'] / pl['median_ms']:.1f}x; "
          f"at the limit the most it could be is {st['median_ms'] / (data_bytes / lim / 1e6):.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(limit_gbs=lim, tensors=len(ref), data_bytes=data_bytes, rows=rows, cold=cold, first=first,
                           device=torch.cuda.get_device_name(dev)), f, indent=1)
    return 0 if all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
