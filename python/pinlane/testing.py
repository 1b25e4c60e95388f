"""Round-trip tests for your own batches: hypothesis strategies for nested batches of
torch tensors, and ``assert_round_trip``, which moves a batch to the GPU and back and
says exactly where anything differs.

    from hypothesis import given
    from pinlane.testing import assert_round_trip, batches

    @given(batches())
    def test_my_batches_survive_the_trip(batch):
        assert_round_trip(batch)

    def test_my_request():
        assert_round_trip({"tokens": torch.arange(512), "images": [torch.rand(3, 64, 64)]})

A difference is an ``AssertionError`` naming the way (H2D, or the round trip), the place
in the batch (``["images"][3]``, ``.labels``), and what differs: the structure, the dtype,
the shape, ``requires_grad``, a forward-mode AD tangent (inside a ``dual_level``), or the
first differing byte with its element and both values. Needs torch;
the strategies also need hypothesis (``pip install hypothesis``). Without a GPU the
transfers return a batch as is, so ``assert_round_trip`` fails with a message saying so
instead of passing a trip that moved nothing (``allow_no_gpu=True`` accepts that).
"""

import dataclasses
import math

from ._tree import _is_dataclass_instance

__all__ = ["assert_round_trip", "first_difference", "patterned", "dtypes", "tensors", "batches"]

# The dtypes pinlane moves itself (others, such as complex and float8, torch moves).
_PINLANE_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                   "float16", "bfloat16", "float32", "float64"]


def _torch():
    import torch  # imported here: importing pinlane.testing needs no torch

    return torch


def _show(path):
    return path or "(the batch itself)"


def first_difference(sent, back, path=""):
    """The first place where ``back`` differs from ``sent`` (nested containers of torch
    tensors and other leaves), as a message, or ``None``. Tensors are compared by dtype,
    shape, ``requires_grad``, bytes (wherever they are: a CUDA tensor is read back to
    compare) and, inside a forward-mode AD ``dual_level``, their tangents;
    containers by type, length, keys or fields; other leaves by identity, as the
    transfers return them."""
    torch = _torch()
    if isinstance(sent, torch.Tensor):
        if not isinstance(back, torch.Tensor):
            return f"{_show(path)}: a {type(back).__name__} came back for a tensor"
        return _tensor_difference(torch, sent, back, path)
    if type(back) is not type(sent):
        return f"{_show(path)}: a {type(back).__name__} came back for a {type(sent).__name__}"
    if isinstance(sent, dict):
        if list(sent.keys()) != list(back.keys()):
            return f"{_show(path)}: keys {list(back.keys())!r}, sent {list(sent.keys())!r}"
        for k in sent:
            d = first_difference(sent[k], back[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(sent, (list, tuple)):
        if len(sent) != len(back):
            return f"{_show(path)}: {len(back)} items came back, {len(sent)} were sent"
        fields = getattr(type(sent), "_fields", None)
        for i, (a, b) in enumerate(zip(sent, back)):
            d = first_difference(a, b, f"{path}.{fields[i]}" if fields else f"{path}[{i}]")
            if d:
                return d
        return None
    if _is_dataclass_instance(sent):
        for f in dataclasses.fields(sent):
            d = first_difference(getattr(sent, f.name), getattr(back, f.name), f"{path}.{f.name}")
            if d:
                return d
        return None
    if back is not sent:
        return f"{_show(path)}: {back!r} came back for {sent!r} (not the same object)"
    return None


def _tensor_difference(torch, a, b, path):
    if a.dtype != b.dtype:
        return f"{_show(path)}: dtype {b.dtype}, sent as {a.dtype}"
    if a.shape != b.shape:
        return f"{_show(path)}: shape {list(b.shape)}, sent as {list(a.shape)}"
    if a.requires_grad != b.requires_grad:
        return f"{_show(path)}: requires_grad {b.requires_grad}, sent as {a.requires_grad}"
    fw = torch.autograd.forward_ad
    if getattr(fw, "_current_level", -1) >= 0:  # a dual level is open (torch's global)
        ta, tb = fw.unpack_dual(a).tangent, fw.unpack_dual(b).tangent
        if (ta is None) != (tb is None):
            got, sent = ("no", "one") if tb is None else ("a", "none")
            return f"{_show(path)}: {got} forward-mode AD tangent came back, {sent} was sent"
        if ta is not None:
            d = _tensor_difference(torch, ta, tb, f"{_show(path)} (its tangent)")
            if d:
                return d
    # torch's lazy negation and conjugation bits resolved (`view(uint8)` refuses them):
    # the values, as the transfers give them.
    x = a.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    y = b.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    if x.numel() == 0:
        return None
    xb, yb = x.view(torch.uint8), y.view(torch.uint8)
    if torch.equal(xb, yb):  # the common case, without a mask the size of the tensor
        return None
    diff = (xb != yb).nonzero()
    if diff.numel() == 0:
        return None
    offset = int(diff[0])
    size = x.element_size()
    element = offset // size

    def show(t, raw):
        v = t[element]
        return f"{v.item()!r} [{' '.join(f'{int(c):02x}' for c in raw[element * size:(element + 1) * size])}]"

    return (f"{_show(path)}: byte {offset} differs: element {element} ({a.dtype}) is {show(y, yb)}, "
            f"sent as {show(x, xb)}")


def assert_round_trip(batch, device=None, *, allow_no_gpu=False):
    """Moves ``batch`` (CPU tensors in containers) with ``pinlane.transfer_tensor_h2d``,
    checks that every tensor arrived on the device (``cuda:{LOCAL_RANK}``) with the same
    bytes, moves it back with ``pinlane.transfer_tensor_d2h`` (from ``device``, default
    ``cuda:{LOCAL_RANK}``), checks that every tensor is on the host again, and compares
    the result with ``batch``: structure, container types, dtypes, shapes,
    ``requires_grad``, bytes, tangents inside a forward-mode AD ``dual_level``, and the
    identity of the other leaves. Returns the batch that came back.

    Raises:
        AssertionError: where and how the batch came back different (or, without a GPU
            and without ``allow_no_gpu``, that nothing moved).
        ValueError: a tensor of ``batch`` is not on the CPU (``transfer_tensor_h2d``
            returns a CUDA tensor as it is, so its check would compare it with itself).
    """
    import pinlane

    torch = _torch()
    for path, t in _tensors_with_paths(torch, batch, ""):
        if t.device.type != "cpu":
            raise ValueError(f"assert_round_trip: {_show(path)} is on {t.device}: give a batch "
                             "of CPU tensors (a CUDA tensor would be compared with itself)")
    if not (pinlane.cuda_available() and torch.cuda.is_available()):
        if allow_no_gpu:
            return batch
        raise AssertionError("assert_round_trip: no GPU here, so nothing would move "
                             "(pass allow_no_gpu=True to accept that)")
    on = pinlane.transfer_tensor_h2d(batch)
    _check_all_on(torch, on, torch.device("cuda", pinlane._native.default_device()),
                  "after transfer_tensor_h2d")
    d = first_difference(batch, on)
    if d:
        raise AssertionError(f"after transfer_tensor_h2d: {d}")
    back = pinlane.transfer_tensor_d2h(on, device=device)
    _check_all_on(torch, back, torch.device("cpu"), "after the round trip")
    d = first_difference(batch, back)
    if d:
        raise AssertionError(f"after the round trip: {d}")
    return back


def _check_all_on(torch, batch, device, when):
    for path, t in _tensors_with_paths(torch, batch, ""):
        if t.device != device:
            raise AssertionError(f"{when}: {_show(path)} is on {t.device}, not {device}")


def _tensors_with_paths(torch, obj, path):
    """Every tensor of ``obj`` with its place, in walk order."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    items = []
    if isinstance(obj, dict):
        items = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        fields = getattr(type(obj), "_fields", None)
        items = [(f"{path}.{fields[i]}" if fields else f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif _is_dataclass_instance(obj):
        items = [(f"{path}.{f.name}", getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    for p, v in items:
        yield from _tensors_with_paths(torch, v, p)


# --- hypothesis strategies -------------------------------------------------------------


def dtypes(names=None):
    """The torch dtypes pinlane moves itself (or those of ``names``)."""
    from hypothesis import strategies as st

    torch = _torch()
    return st.sampled_from([getattr(torch, n) for n in (names or _PINLANE_DTYPES)])


def patterned(dtype, shape, seed, pinned=False):
    """A CPU tensor of ``dtype`` and ``shape`` whose bytes reveal misplaced data (random,
    from ``seed``; bool tensors hold 0 and 1), page-locked with ``pinned=True``."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (math.prod(shape) * size,), dtype=torch.uint8, generator=g)
    t = ((raw % 2 == 1) if dtype == torch.bool else raw.view(dtype)).reshape(tuple(shape))
    return t.pin_memory() if pinned else t


def tensors(dtype=None, max_rank=4, max_elems=4096, pinned=False):
    """CPU tensors of ``dtype`` (default: any of ``dtypes()``), rank 0 to ``max_rank``
    (0-dim and zero-size ones included), at most ``max_elems`` elements, with bytes that
    reveal misplaced data; page-locked with ``pinned=True`` (needs a GPU), both kinds with
    ``pinned=None``."""
    from hypothesis import strategies as st

    side = max(1, int(round(max_elems ** (1.0 / max(max_rank, 1)))))

    def fit(shape):
        shape = list(shape)
        while shape and math.prod(shape) > max_elems:
            i = shape.index(max(shape))
            shape[i] -= 1
        return tuple(shape)

    pin = st.booleans() if pinned is None else st.just(bool(pinned))
    return st.builds(
        lambda d, shape, seed, p: patterned(d, fit(shape), seed, pinned=p),
        dtypes() if dtype is None else st.just(dtype),
        st.lists(st.integers(0, side), min_size=0, max_size=max_rank),
        st.integers(0, 2**32 - 1),
        pin,
    )


def batches(leaves=None, max_depth=3, max_width=5):
    """Nested batches of the containers the transfer calls accept (list, tuple, dict,
    namedtuple, dataclass) around ``leaves`` (default: ``tensors()``, with an occasional
    non-tensor leaf)."""
    import collections

    from hypothesis import strategies as st

    base = leaves if leaves is not None else st.one_of(
        tensors(), tensors(), tensors(), st.integers(), st.text(max_size=4), st.none())
    Pair = collections.namedtuple("Pair", ["first", "second"])

    def extend(inner):
        return st.one_of(
            st.lists(inner, max_size=max_width),
            st.lists(inner, max_size=max_width).map(tuple),
            st.dictionaries(st.text(alphabet="abcdefgh", min_size=1, max_size=4), inner, max_size=max_width),
            st.builds(Pair, inner, inner),
            st.builds(_Sample, inner, inner),
        )

    return st.recursive(base, extend, max_leaves=max_width * max_depth * 2)


@dataclasses.dataclass
class _Sample:
    """A dataclass container for ``batches()``."""

    image: object
    label: object
