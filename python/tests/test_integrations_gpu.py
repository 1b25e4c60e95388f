"""The places users plug pinlane in, on the GPU machine: the examples under
python/examples/ (Lightning, a DataLoader loop, torchrun), pinlane.prefetch with torch
tensors, and `python -m pinlane.bench`. Each example runs as a user would run it, in its
own process, and fails its test when the bytes or the training differ."""

import os
import pathlib
import subprocess
import sys

import pytest

import pinlane

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run(args, timeout=300):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    print(out.stdout[-3000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


def test_lightning_trains_identically_with_pinlanes_hook(torch):
    if not (_has("lightning") or _has("pytorch_lightning")):
        pytest.skip("Lightning is not installed")
    out = run([str(EXAMPLES / "lightning_hook.py"), "--compare", "--steps", "40"])
    assert "identical losses: True; identical weights: True" in out


def test_lightning_mixin_gives_what_lightnings_hook_gives(torch, monkeypatch):
    """The mixin moves a batch with pinlane only when pinlane gives what Lightning's hook
    gives; a batch holding an object whose class moves itself with ``.to()`` (a Hugging
    Face ``BatchEncoding`` is a ``UserDict`` with ``.to``; a dataclass or list subclass
    with ``.to``), a mapping that is not a dict, a ``UserList``, a dataclass with a field
    outside ``__init__``, or a tensor on another GPU goes to Lightning's hook. Before
    session 63 those came back unmoved or moved otherwise (the tensor on another GPU
    stayed there)."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl
        except ImportError:
            pytest.skip("Lightning is not installed")
    import collections
    import dataclasses
    import functools
    import types

    import pinlane.lightning as pll

    class Encoding(collections.UserDict):  # as transformers' BatchEncoding
        def to(self, device):
            return Encoding({k: v.to(device) for k, v in self.data.items()})

    @dataclasses.dataclass
    class Moves:  # a batch class that moves itself (and says so)
        x: torch.Tensor
        via_to: bool = False

        def to(self, device, **kwargs):
            return Moves(self.x.to(device, **kwargs), via_to=True)

    class Listed(list):  # a list that moves itself
        def to(self, device, **kwargs):
            out = Listed(t.to(device, **kwargs) for t in self)
            out.via_to = True
            return out

    @dataclasses.dataclass
    class Held:  # Lightning leaves a field outside __init__ as it is
        x: torch.Tensor
        cache: torch.Tensor = dataclasses.field(init=False)

        def __post_init__(self):
            self.cache = self.x * 2

    @dataclasses.dataclass
    class Cached:  # Lightning's copy drops a cached property's value
        x: torch.Tensor

        @functools.cached_property
        def m(self):
            return self.x.mean()

    cached = Cached(torch.arange(4, dtype=torch.float32))
    cached.m  # noqa: B018 - computed (on the CPU) before the move

    class Plain(pll.PinlaneTransfer, pl.LightningModule):
        pass

    calls = []
    real = pll.transfer_tensor_h2d
    monkeypatch.setattr(pll, "transfer_tensor_h2d", lambda b, **k: calls.append(1) or real(b, **k))
    idx = pinlane._native.default_device()
    target = torch.device("cuda", idx)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    batches = {
        "flat dict": ({"x": x, "y": x + 1}, True),
        "nested": ([{"x": x}, (x * 2, "text", 3)], True),
        "already there": ({"x": x.to(target), "y": x}, True),
        "BatchEncoding": (Encoding(input_ids=x, mask=x > 3), False),
        "inside a list": ([Encoding(a=x), x], False),
        "a mapping": (types.MappingProxyType({"x": x}), False),
        "a dataclass with .to": ({"m": Moves(x)}, False),
        "a list with .to": (Listed([x, x + 1]), False),
        "a UserList": (collections.UserList([x]), False),
        "a field outside __init__": (Held(x), False),
        "a plain dataclass": ({"p": _plain_dataclass(x)}, True),
        # Session 79 (a helper's review): strides Lightning's .to() keeps, and a cached
        # property's value it drops, went to pinlane (contiguous outputs; the CPU value).
        "channels_last": ({"x": torch.rand(2, 3, 4, 4).to(memory_format=torch.channels_last)}, False),
        # One channel: torch calls it contiguous (a size-1 dimension's stride is ignored).
        "channels_last, one channel": ([torch.rand(2, 1, 4, 4).to(memory_format=torch.channels_last)], False),
        "a transposed view": ([x.t()], False),
        "a cached property": ({"c": cached}, False),
    }
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", 1 - idx if idx < 2 else 0)
        batches["another GPU"] = ({"x": x.to(other), "y": x}, False)
    module = Plain()
    for name, (batch, by_pinlane) in batches.items():
        for device in (target, torch.device("cuda")):
            if device.index is None and torch.cuda.current_device() != idx:
                continue
            calls.clear()
            got = module.transfer_batch_to_device(batch, device, 0)
            want = pl.LightningModule.transfer_batch_to_device(module, batch, device, 0)
            assert bool(calls) == by_pinlane, (name, device)
            _same(got, want, name)
    # Where pinlane cannot use CUDA (its driver probe failed while torch's worked), every
    # batch goes to Lightning's hook (session 79: it came back unmoved).
    monkeypatch.setattr(pll, "cuda_available", lambda: False)
    calls.clear()
    got = module.transfer_batch_to_device({"x": x}, target, 0)
    assert not calls and got["x"].device == target


def _plain_dataclass(x):
    import dataclasses

    @dataclasses.dataclass
    class Plain:
        x: object
        label: str = "a"

    return Plain(x)


def _same(got, want, name):
    """``got`` is ``want``: the same types and structure (and ``via_to`` marks), tensors
    equal on the same device."""
    import collections.abc
    import dataclasses

    import torch

    assert type(got) is type(want), (name, type(got), type(want))
    assert getattr(got, "via_to", None) == getattr(want, "via_to", None), name
    if isinstance(want, torch.Tensor):
        assert got.device == want.device and torch.equal(got, want), name
        assert got.stride() == want.stride(), (name, got.stride(), want.stride())
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            _same(getattr(got, f.name), getattr(want, f.name), name)
    elif isinstance(want, collections.abc.Mapping):
        assert list(got) == list(want), name
        for k in want:
            _same(got[k], want[k], name)
    elif isinstance(want, collections.abc.Sequence) and not isinstance(want, str):
        assert len(got) == len(want), name
        for a, b in zip(got, want):
            _same(a, b, name)
    else:
        assert got == want, name


def _has(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def test_dataloader_loop_moves_the_same_bytes_three_ways(torch):
    out = run([str(EXAMPLES / "dataloader_loop.py"), "--batches", "30", "--workers", "2"])
    assert "same bytes everywhere: True" in out


def test_torchrun_ranks_receive_exact_bytes(torch):
    env = dict(os.environ)
    env.pop("LOCAL_RANK", None)  # torchrun sets it per process
    n = min(torch.cuda.device_count(), 2)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
         str(EXAMPLES / "torchrun_checksum.py")],
        capture_output=True, text=True, timeout=300, env=env)
    print(out.stdout[-2000:], out.stderr[-2000:])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert f"{n} rank(s):" in out.stdout and "exact" in out.stdout


def test_prefetch_moves_torch_batches_in_order_and_frees_on_the_callers_stream(torch):
    idx = pinlane._native.default_device()
    dev = torch.device("cuda", idx)
    g = torch.Generator().manual_seed(5)
    host = [{"x": torch.randint(0, 1000, (1 << 20,), generator=g).float(), "i": torch.tensor(i)} for i in range(12)]
    side = torch.cuda.Stream(dev)
    sums = []
    with torch.cuda.stream(side):
        with pinlane.prefetch(host, depth=2, num_caches=0) as batches:
            for k, b in enumerate(batches):
                assert b["x"].device == dev and int(b["i"]) == k
                torch.cuda._sleep(20_000_000)  # the read runs late on the side stream
                sums.append(b["x"].double().sum())  # queued on the side stream
                del b  # freed in order on the side stream: not reused before the sum ran
    side.synchronize()
    assert [s.item() for s in sums] == [t["x"].double().sum().item() for t in host]


def test_prefetch_moves_under_the_callers_grad_and_inference_modes(torch):
    """The worker thread runs under the grad and inference modes the caller had when it
    called ``prefetch``, so a batch comes out as ``transfer_tensor_h2d`` on the caller's
    thread gives it (a tensor that requires grad, moved by torch's ``.to()``, records
    autograd only where grad is on). Before session 63 the worker ran with torch's
    defaults: under ``no_grad`` its outputs had a ``grad_fn``."""
    w = torch.ones(4, requires_grad=True)
    plain = torch.arange(8.0)
    for mode in (torch.no_grad, torch.inference_mode, torch.enable_grad):
        with mode():
            want = pinlane.transfer_tensor_h2d({"w": w, "p": plain})
            got = list(pinlane.prefetch([{"w": w, "p": plain}]))[0]
        for k in want:
            a, b = got[k], want[k]
            assert (a.requires_grad, a.grad_fn is None, a.is_inference()) == (
                b.requires_grad, b.grad_fn is None, b.is_inference()), (mode.__name__, k)
            assert torch.equal(a.detach().cpu(), b.detach().cpu())
    with torch.no_grad():
        assert pinlane.transfer_tensor_h2d({"w": w})["w"].grad_fn is None  # what the test needs


def test_bench_runs_one_small_batch(torch):
    out = run(["-m", "pinlane.bench", "--batch", "4x256:float32", "--quick"])
    assert "| 4 x 256 float32 | H2D |" in out and "| 4 x 256 float32 | D2H |" in out
