"""Probe (session 80): does torch's non-owning DLPack view (the exchange API's
`dltensor_from_py_object_no_sync`, what the binding's fast paths read tensors through)
refuse a tensor with the negation bit, as the flat paths' `any(map(Tensor.is_neg, ...))`
check (~0.1 us a tensor) assumes it may not? And what does that check cost for 1000
tensors against the view itself?

    bash .gpu/with-python python3 benches/probes/neg_view.py    # on the GPU machine
"""

import ctypes
import time

import torch


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


def api_entry(offset):
    """The address of the function at byte `offset` of torch's exchange API table: the
    header (version, prev_api: 16 bytes), then allocator, managed_from, managed_to,
    dltensor_from (offset 40), current_work_stream (48)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api = get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    return ctypes.c_void_p.from_address(api + offset).value


def view_fn():
    addr = api_entry(40)
    return ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))(addr)


def main():
    f = view_fn()
    z = torch.randn(8, dtype=torch.complex64)
    cases = {
        "plain cpu": torch.randn(8),
        "neg view cpu (_neg_view)": torch._neg_view(torch.randn(8)),
        "conj().imag cpu": z.conj().imag,
        "conj cpu (complex)": z.conj(),
        "requires_grad cpu": torch.randn(8, requires_grad=True),
        "neg view cuda": torch._neg_view(torch.randn(8, device="cuda")),
        "plain cuda": torch.randn(8, device="cuda"),
    }
    for name, t in cases.items():
        out = DLTensor()
        try:
            rc = f(t, ctypes.byref(out))
            res = f"rc={rc} data==data_ptr: {out.data == t.data_ptr()} code={out.code} bits={out.bits}"
        except Exception as e:  # noqa: BLE001
            res = f"raised {type(e).__name__}: {e}"
        print(f"{name:<28} is_neg={t.is_neg()} is_conj={t.is_conj()} -> {res}")
    ts = [torch.randn(256) for _ in range(1000)]
    is_neg = torch.Tensor.is_neg
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(100):
            any(map(is_neg, ts))
        t1 = time.perf_counter()
        out = DLTensor()
        for _ in range(100):
            for t in ts:
                f(t, ctypes.byref(out))
        t2 = time.perf_counter()
        print(f"any(map(is_neg)) over 1000: {(t1 - t0) * 1e4:.1f} us; 1000 views through ctypes: {(t2 - t1) * 1e4:.1f} us")


if __name__ == "__main__":
    main()
