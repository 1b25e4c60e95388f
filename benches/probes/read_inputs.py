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

N, ROUNDS = 1000, 30


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class Header(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p)]


class ExchangeApi(ctypes.Structure):
    _fields_ = [
        ("header", Header),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


def exchange_api():
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    api = ExchangeApi.from_address(ptr)
    assert api.header.major == 1, api.header.major
    view = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensor))(
        api.dltensor_from_py_object_no_sync)
    stream = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32,
                              ctypes.POINTER(ctypes.c_void_p))(api.current_work_stream)
    return view, stream


def main():
    view, stream = exchange_api()
    ts = [torch.randn(256) for _ in range(N)]
    out = DLTensor()
    ref = ctypes.byref(out)
    s = ctypes.c_void_p()
    sref = ctypes.byref(s)
    # The view says what torch has: the first tensor's data pointer and size.
    assert view(id(ts[0]), ref) == 0
    assert out.data + out.byte_offset == ts[0].data_ptr() and out.ndim == 1 and out.shape[0] == 256
    assert stream(1, 0, sref) == 0 and not s.value  # kDLCPU: no stream

    def views():
        for t in ts:
            view(id(t), ref)

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
