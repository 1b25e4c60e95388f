"""The package's behaviour where no tensor moves: on any machine, with or without torch
or a GPU (CI has neither). Batches of numpy arrays and plain objects come back as is;
bad arguments raise spdl's exceptions before anything else."""

import collections
import importlib.metadata
import pathlib
import re
import sys

import numpy as np
import pytest

import pinlane


def test_import_needs_neither_torch_nor_a_gpu(new_process):
    code = "import sys, pinlane; assert 'torch' not in sys.modules; print(pinlane.cuda_available())"
    out = new_process(code)
    assert out.stdout.strip() in ("True", "False")


def test_spdl_names_and_signatures():
    import inspect

    h2d = inspect.signature(pinlane.transfer_tensor_h2d).parameters
    assert list(h2d) == ["batch", "num_caches"]
    assert h2d["batch"].kind is inspect.Parameter.POSITIONAL_ONLY
    assert h2d["num_caches"].kind is inspect.Parameter.KEYWORD_ONLY and h2d["num_caches"].default == 4
    d2h = inspect.signature(pinlane.transfer_tensor_d2h).parameters
    assert list(d2h) == ["batch", "device", "stream", "producer_event"]
    assert all(d2h[k].default is None for k in ("device", "stream", "producer_event"))


Point = collections.namedtuple("Point", "x y")


@pytest.mark.parametrize("fn", [pinlane.transfer_tensor_h2d, pinlane.transfer_tensor_d2h])
def test_a_batch_without_torch_tensors_comes_back_as_is(fn):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    batch = {"img": arr, "meta": [1, "two", None], "p": Point(arr, 2.5)}
    out = fn(batch)
    assert out is batch
    assert out["img"] is arr and out["p"].x is arr


def test_bad_devices_are_value_errors_on_every_machine():
    for bad in ["cpu", "cuda:x", "gpu", "", "CUDA:0", "cuda:-1"]:
        with pytest.raises(ValueError):
            pinlane.transfer_tensor_d2h([1], device=bad)
    with pytest.raises(ValueError):
        pinlane.transfer_tensor_d2h([1], device=1.5)


def test_a_stream_without_a_device_is_a_value_error():
    with pytest.raises(ValueError, match="device"):
        pinlane.transfer_tensor_d2h([1], stream=object())


@pytest.mark.parametrize("n", [-1, 1.0, "4", True, None])
def test_bad_num_caches_is_a_value_error(n):
    with pytest.raises(ValueError, match="num_caches"):
        pinlane.transfer_tensor_h2d([1], num_caches=n)


def test_one_version_for_the_crate_and_the_package():
    root = pathlib.Path(__file__).resolve().parents[2] / "Cargo.toml"
    crate = re.search(r'^version = "([^"]+)"', root.read_text(), re.M).group(1)
    assert pinlane.__version__ == crate
    assert importlib.metadata.version("pinlane") == crate


def test_memory_stats_and_trim():
    pinlane.trim()
    stats = pinlane.memory_stats()
    assert set(stats) == {"staging", "pinned_outputs", "pageable_outputs", "devices",
                          "background_errors", "pageable_fallbacks", "slot_waits",
                          "retained_bytes", "kept_device_block_bytes"}
    assert stats["staging"]["in_use_bytes"] == 0
    assert stats["kept_device_block_bytes"] == 0
    assert type(stats["slot_waits"]) is int and type(stats["pageable_fallbacks"]) is int
    for d in stats["devices"].values():
        assert set(d) == {"reserved_bytes", "used_bytes", "end_flags"}
        assert type(d["end_flags"]) is bool


def test_shutdown_without_a_transfer_and_bad_timeouts():
    pinlane.shutdown()
    assert pinlane.memory_stats()["staging"]["held_bytes"] == 0
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            pinlane.shutdown(bad)


def test_configure_is_strict_and_once_per_process(new_process):
    # Configuration is per process: a fresh interpreter for each run.
    code = """
import pinlane
for bad, why in [
    ({"arena_bytes": "lots"}, "PINLANE_ARENA_BYTES"),
    ({"arenna_bytes": 1}, "arenna_bytes"),
    ({"copy_threads": True}, "only nt_copy"),  # a bool is no thread count (session 78)
]:
    try:
        pinlane.configure(**bad)
        print("accepted", bad)
    except ValueError as e:
        print("refused", why in str(e))
pinlane.configure(arena_bytes=64 << 20, copy_threads=2, h2d_small="kernel")
pinlane.configure(arena_bytes=64 << 20, copy_threads=2, h2d_small="kernel")  # again: fine
try:
    pinlane.configure(arena_bytes=32 << 20)
    print("accepted a second, different configuration")
except RuntimeError as e:
    print("running", "already" in str(e).lower() or "running" in str(e).lower())
"""
    out = new_process(code)
    assert out.stdout.split("\n")[:4] == ["refused True"] * 3 + ["running True"], out.stdout


def test_a_traced_call_records_the_bindings_own_phases_once():
    # `_native.trace_next_call()` arms the binding's phase timer for the thread's next
    # call (the benches' split of a call outside the engine). A flat batch of stand-ins is
    # walked, then refused for its device string: the phases up to there, and "end".
    from pinlane import _native

    class T:
        def is_neg(self):
            return False

    _native.trace_next_call()
    # A batch the flat entry turns away (not all of the tensor type) is not the timed
    # call: the thread stays armed for the entry that moves it.
    assert _native.d2h_flat(["x"], T, None) is None
    assert _native.h2d_flat([T(), "x"], T, 2) is None
    with pytest.raises(ValueError):
        _native.d2h_flat([T(), T()], T, "bogus")
    marks = _native.last_split()
    assert [m for m, _ in marks] == ["walked", "end"], marks
    assert 0 <= marks[0][1] <= marks[1][1]
    # Unarmed, a call leaves the last phases as they were.
    with pytest.raises(ValueError):
        _native.d2h_flat([T()], T, "bogus")
    assert _native.last_split() == marks
