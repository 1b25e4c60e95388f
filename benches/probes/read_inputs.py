"""Probe (session 82, not run yet): what torch itself costs per tensor where the binding
reads an H2D call's inputs (`many_split.py`'s phase to 'imported': 406 us for 1000 x 1
KiB on an H100 host in session 82, about 0.4 us a tensor). Calls torch's DLPack exchange
API (`torch.Tensor.__dlpack_c_exchange_api__`) through ctypes, over the same 1000 CPU
tensors, in rounds:

* `dltensor_from_py_object_no_sync` of each tensor (what `Torch::host_view` asks torch);
* `current_work_stream(kDLCPU, 0)` (dlpark's `with_tensor_view_no_sync` asks it too, per
  tensor; for the CPU torch returns null at once): also the ctypes call's own cost, which
  the first minus this one removes;
* `t.requires_grad` of each tensor, and `type(t) is torch.Tensor` (the binding's other
  per-tensor questions), and an empty loop over the tensors.

    bash .gpu/with-python python3 benches/probes/read_inputs.py    # on the GPU machine

Prints the medians per tensor (ns). torch's own share of the phase is the first row
minus the second; the rest of the phase is the binding's.
"""

import ctypes
import statistics
import time

import torch

from neg_view import DLTensor, api_entry, view_fn  # session 80's probe, beside this one

N, ROUNDS = 1000, 30


def stream_fn():
    """torch's `current_work_stream(device_type, device_id, out)`."""
    return ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32,
                             ctypes.POINTER(ctypes.c_void_p))(api_entry(48))


def main():
    view, stream = view_fn(), stream_fn()
    ts = [torch.randn(256) for _ in range(N)]
    out = DLTensor()
    ref = ctypes.byref(out)
    s = ctypes.c_void_p()
    sref = ctypes.byref(s)
    # The view says what torch has: the first tensor's data pointer and size.
    assert view(ts[0], ref) == 0
    assert out.data + out.byte_offset == ts[0].data_ptr() and out.ndim == 1 and out.bits == 32
    assert stream(1, 0, sref) == 0 and not s.value  # kDLCPU: no stream

    def views():
        for t in ts:
            view(t, ref)

    def streams():
        for _ in ts:
            stream(1, 0, sref)

    def grads():
        for t in ts:
            t.requires_grad

    tensor = torch.Tensor

    def types():
        for t in ts:
            type(t) is tensor

    def loop():
        for _ in ts:
            pass

    ways = [("dltensor_from_py_object_no_sync", views), ("current_work_stream (CPU)", streams),
            ("t.requires_grad", grads), ("type(t) is torch.Tensor", types), ("empty loop", loop)]
    times = {n: [] for n, _ in ways}
    for r in range(ROUNDS + 3):
        for n, fn in ways if r % 2 else reversed(ways):
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r >= 3:
                times[n].append(dt / N * 1e9)
    med = {n: statistics.median(v) for n, v in times.items()}
    for n, _ in ways:
        print(f"  {n:<34} {med[n]:7.1f} ns a tensor")
    print(f"  torch's view alone (first minus second) {med[ways[0][0]] - med[ways[1][0]]:7.1f} ns a tensor")


if __name__ == "__main__":
    main()
