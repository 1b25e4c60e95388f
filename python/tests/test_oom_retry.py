"""Out of device memory from Python (no GPU needed: torch and the native half are stood
in for). ``transfer_tensor_h2d`` and ``load_safetensors`` have torch's caching allocator
give back the device memory it holds unused (``torch.cuda.empty_cache()``), as torch's
own ``.to()`` does before it fails, and try once more; the real thing is
``test_h2d_gets_back_what_torchs_cache_holds`` in test_torch_gpu.py."""

import sys
import types

import pytest

import pinlane


def fake_torch(reserved, allocated, initialized=True):
    emptied = []
    cuda = types.SimpleNamespace(
        is_initialized=lambda: initialized,
        memory_reserved=lambda d: reserved[d],
        memory_allocated=lambda d: allocated[d],
        empty_cache=lambda: emptied.append(True),
    )
    return types.SimpleNamespace(cuda=cuda), emptied


def test_torchs_cache_gives_back_only_what_it_holds_unused(monkeypatch):
    torch, emptied = fake_torch(reserved={1: 100}, allocated={1: 40})
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert pinlane._torch_cache_given_back(1) is True
    assert emptied == [True]
    # Everything torch holds is in use: nothing to give back, nothing asked.
    torch, emptied = fake_torch(reserved={1: 100}, allocated={1: 100})
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert pinlane._torch_cache_given_back(1) is False
    assert emptied == []
    # torch never set CUDA up: not asked.
    torch, emptied = fake_torch(reserved={}, allocated={}, initialized=False)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert pinlane._torch_cache_given_back(1) is False
    # torch not loaded: nothing is imported for it.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert pinlane._torch_cache_given_back(1) is False
    assert "torch" not in sys.modules


def walked_failing(times):
    """A stand-in for the walked H2D that raises MemoryError its first `times` calls."""
    calls = []

    def walked(batch, num_caches):
        calls.append(num_caches)
        if len(calls) <= times:
            raise MemoryError("CUDA_ERROR_OUT_OF_MEMORY (stand-in)")
        return {"moved": batch}

    return walked, calls


def test_h2d_tries_once_more_after_torchs_cache_gave_memory_back(monkeypatch):
    walked, calls = walked_failing(1)
    given = []
    monkeypatch.setattr(pinlane, "_h2d_walked", walked)
    monkeypatch.setattr(pinlane, "_torch_cache_given_back", lambda d: given.append(d) or True)
    batch = {"a": object()}
    assert pinlane.transfer_tensor_h2d(batch, num_caches=2) == {"moved": batch}
    assert calls == [2, 2] and given == [None]  # None: cuda:{LOCAL_RANK}


@pytest.mark.parametrize(
    "failures, given_back, tries",
    [(1, False, 1), (2, True, 2)],
    ids=["nothing given back: one try", "the retry fails too: its error, no third try"],
)
def test_h2d_raises_when_torch_gave_nothing_back_or_the_retry_fails(monkeypatch, failures, given_back, tries):
    walked, calls = walked_failing(failures)
    monkeypatch.setattr(pinlane, "_h2d_walked", walked)
    monkeypatch.setattr(pinlane, "_torch_cache_given_back", lambda d: given_back)
    with pytest.raises(MemoryError):
        pinlane.transfer_tensor_h2d({"a": object()})
    assert len(calls) == tries


def test_h2d_raises_an_earlier_out_of_memory_error_untried(monkeypatch):
    # An out-of-memory error recorded on the device by earlier work (an owner's drop), met
    # by the call before it touched the batch: the native exception holds it. A retry that
    # succeeded would lose it for good (session 87), so it is raised at once.
    calls, given = [], []

    def walked(batch, num_caches):
        calls.append(num_caches)
        if len(calls) == 1:
            e = MemoryError("earlier work: CUDA_ERROR_OUT_OF_MEMORY (stand-in)")
            setattr(e, pinlane._native.UNRECEIVED, object())
            raise e
        return {"moved": batch}

    monkeypatch.setattr(pinlane, "_h2d_walked", walked)
    monkeypatch.setattr(pinlane, "_torch_cache_given_back", lambda d: given.append(d) or True)
    with pytest.raises(MemoryError, match="earlier work"):
        pinlane.transfer_tensor_h2d({"a": object()})
    assert calls == [4] and given == []
