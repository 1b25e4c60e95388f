"""pinlane.load_safetensors where torch sees no GPU (the build machine, CI with torch):
host copies of a checkpoint written here byte by byte, all of it, a list of names, or a
predicate; a predicate's error reaches the caller. On the GPU machine the same calls load
onto the device, and the same checks hold on the tensors' bytes."""

import json
import struct
import sys
import types

import pytest

import pinlane


def _write(path, tensors):
    """A safetensors file: 8-byte header length, JSON header, then the bytes in order."""
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


TENSORS = {
    "model.layers.0.w": ("F32", [2, 2], struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)),
    "model.layers.0.b": ("I64", [3], struct.pack("<3q", -1, 0, 1 << 40)),
    "model.layers.1.w": ("F32", [2], struct.pack("<2f", 5.0, 6.0)),
    "lm_head": ("U8", [5], bytes([0, 1, 2, 254, 255])),
}


def _bytes(t):
    return t.cpu().contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()


def test_names_by_list_or_predicate(tmp_path):
    pytest.importorskip("torch")
    p = tmp_path / "m.safetensors"
    _write(p, TENSORS)
    assert pinlane._native.safetensors_names(str(p)) == list(TENSORS)
    every = pinlane.load_safetensors(p)
    assert list(every) == list(TENSORS)
    for k, (_, shape, data) in TENSORS.items():
        assert list(every[k].shape) == shape and _bytes(every[k]) == data, k
    asked = []
    layer0 = pinlane.load_safetensors(p, names=lambda n: asked.append(n) or n.startswith("model.layers.0."))
    assert asked == list(TENSORS)
    assert list(layer0) == ["model.layers.0.w", "model.layers.0.b"]
    assert _bytes(layer0["model.layers.0.b"]) == TENSORS["model.layers.0.b"][2]
    assert list(pinlane.load_safetensors(p, names=["lm_head"])) == ["lm_head"]
    assert pinlane.load_safetensors(p, names=lambda n: False) == {}


def test_a_predicates_error_and_bad_names(tmp_path):
    pytest.importorskip("torch")
    p = tmp_path / "m.safetensors"
    _write(p, TENSORS)

    def boom(name):
        raise KeyError(f"no rule for {name}")

    with pytest.raises(KeyError, match="no rule for model.layers.0.w"):
        pinlane.load_safetensors(p, names=boom)
    with pytest.raises(ValueError, match="one string"):
        pinlane.load_safetensors(p, names="lm_head")
    with pytest.raises(ValueError, match="nothere"):
        pinlane.load_safetensors(p, names=["nothere"])
    with pytest.raises(OSError):
        pinlane._native.safetensors_names(str(tmp_path / "missing.safetensors"))
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError):
        pinlane._native.safetensors_names(str(tmp_path / "bad.safetensors"))


def test_a_predicate_over_a_sharded_checkpoint(tmp_path):
    """Shards are read by file name, then by place in each file; the predicate sees every
    name in that order, from the index, the directory, or either shard's file."""
    pytest.importorskip("torch")
    names = list(TENSORS)
    _write(tmp_path / "model-00002-of-00002.safetensors", {k: TENSORS[k] for k in names[:2]})
    _write(tmp_path / "model-00001-of-00002.safetensors", {k: TENSORS[k] for k in names[2:]})
    wm = {k: f"model-0000{1 if i >= 2 else 2}-of-00002.safetensors" for i, k in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    order = names[2:] + names[:2]
    for where in (tmp_path, tmp_path / "model.safetensors.index.json"):
        assert pinlane._native.safetensors_names(str(where)) == order
        asked = []
        got = pinlane.load_safetensors(where, names=lambda n: asked.append(n) or n.endswith(".w"))
        assert asked == order
        assert list(got) == [n for n in order if n.endswith(".w")]
        for k, t in got.items():
            assert _bytes(t) == TENSORS[k][2], k


def test_a_cuda_device_pinlane_cannot_use_is_an_error_where_torch_has_cuda(tmp_path, monkeypatch):
    """Session 88 (a helper's review): session 79's check sat inside the branch taken only
    when pinlane sees a device, so a process whose driver probe failed, with torch seeing
    CUDA, got CPU tensors for ``device="cuda:0"``. No GPU needed: torch is stood in for,
    and pinlane is made to see no device (as a failed probe leaves it)."""
    torch_cuda = {"is": True}
    stand_in = types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: torch_cuda["is"]),
        empty=lambda *a, **k: None,
    )
    monkeypatch.setitem(sys.modules, "torch", stand_in)
    monkeypatch.setattr(pinlane._native, "device_count", lambda: 0)
    monkeypatch.setattr(pinlane, "_cuda_seen", False)
    loaded = []
    monkeypatch.setattr(pinlane._native, "load_safetensors", lambda *a, **k: loaded.append(k) or ([], []))
    p = tmp_path / "m.safetensors"
    _write(p, TENSORS)
    for dev in ("cuda", "cuda:0", 0, "cuda:3"):
        with pytest.raises(RuntimeError, match="cannot use CUDA"):
            pinlane.load_safetensors(p, dev)
    assert loaded == []
    # No device asked for: host copies, as documented (the native load, device None).
    assert pinlane.load_safetensors(p) == {}
    assert loaded[-1]["device"] is None
    # torch without CUDA: host copies whatever the device says.
    torch_cuda["is"] = False
    assert pinlane.load_safetensors(p, "cuda:0") == {}
    assert loaded[-1]["device"] is None
