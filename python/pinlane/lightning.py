"""PyTorch Lightning: batches moved by pinlane in ``transfer_batch_to_device``.

Either put the mixin first among your module's bases::

    import lightning.pytorch as pl
    from pinlane.lightning import PinlaneTransfer

    class Model(PinlaneTransfer, pl.LightningModule):
        ...

or write the three lines yourself::

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if device.type == "cuda":
            return pinlane.transfer_tensor_h2d(batch)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

pinlane moves to ``cuda:{LOCAL_RANK}``, the device Lightning gives each process under its
launchers and ``torchrun`` when it uses the first devices (with ``devices=[2, 3]`` the
ranks run on ``cuda:2`` and ``cuda:3``: then every batch goes to Lightning's hook, and
``pinlane.load_safetensors(path, self.device)`` names the device a load should use);
the mixin hands any other device to Lightning's own hook, as it does everything when
pinlane cannot use CUDA here (``pinlane.cuda_available()`` false).
pinlane walks lists, tuples, namedtuples, dicts and dataclasses of torch tensors; other
objects come back as they are. The mixin looks at the batch first and hands it to
Lightning's hook when pinlane would give something else: when it holds an object whose
class moves itself with ``.to()`` (a Hugging Face ``BatchEncoding``, a custom batch class,
also one that is a list, dict or dataclass), a mapping that is not a ``dict``, a sequence
that is not a ``list`` or ``tuple`` (a ``UserList``, a ``deque``), a dataclass with a
field outside ``__init__`` (Lightning leaves those unmoved) or with a
``functools.cached_property`` value (Lightning's copy drops it, to be computed again on
the device), a CPU tensor whose strides are not row-major (``channels_last``, also with
one channel, a transposed view: Lightning's ``.to()`` keeps them, pinlane's outputs are
row-major), or a tensor on a device other than the CPU and the target (another GPU). So
the mixin's result is what Lightning's hook gives, moved faster where it can be. The three lines above skip that look: use them only for
batches of plain containers. Importing this module needs neither Lightning nor torch.
"""

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from itertools import repeat

from . import _native, cuda_available, transfer_tensor_h2d

__all__ = ["PinlaneTransfer"]


class PinlaneTransfer:
    """A ``LightningModule`` mixin whose ``transfer_batch_to_device`` moves batches with
    ``pinlane.transfer_tensor_h2d`` when the target is pinlane's device
    (``cuda:{LOCAL_RANK}``) and pinlane moves all that Lightning's hook would, and with
    the next class's hook otherwise (see the module's text)."""

    #: ``num_caches`` of each move: the last batches whose device memory the thread keeps.
    pinlane_num_caches = 4

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if device.type == "cuda":
            index = device.index
            if index is None:  # Lightning's hook moves to torch's current device then
                import torch

                index = torch.cuda.current_device()
            if (
                index == _native.default_device()
                and cuda_available()
                and _pinlane_moves_all(batch, index)
            ):
                return transfer_tensor_h2d(batch, num_caches=self.pinlane_num_caches)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


def _pinlane_moves_all(batch, index):
    """Whether pinlane's H2D of ``batch`` to ``cuda:{index}`` gives what Lightning's hook
    would: no object whose class moves itself with ``.to()`` but is not a tensor (a
    container of such a class included), no mapping that is not a ``dict`` and no
    sequence that is not a ``list`` or ``tuple``, no dataclass with a field outside
    ``__init__`` or a cached property's value, no CPU tensor whose strides are not
    row-major, no tensor on a device other than the CPU and ``cuda:{index}`` (pinlane
    passes a CUDA tensor through; Lightning moves it)."""
    import torch

    T = torch.Tensor
    if type(batch) is dict:  # a training batch: a flat dict of tensors, without the walk
        values = batch.values()
        if all(map(isinstance, values, repeat(T))):
            return all(map(_here, values, repeat(index)))
    return _walk(batch, T, index)


def _here(t, index):
    # A CPU tensor with other strides than row-major ones, even where torch calls it
    # contiguous (a one-channel `channels_last` image: torch ignores a size-1 dimension's
    # stride): Lightning's `.to()` keeps them, pinlane's outputs are row-major.
    return t.is_cpu and t.stride() == _row_major(t.shape) or t.is_cuda and t.get_device() == index


def _row_major(shape):
    """The strides torch gives a contiguous tensor of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _walk(obj, T, index):
    # In Lightning's order: a tensor, then anything whose class has a callable `.to` (a
    # custom batch class moves itself, whatever container it also is), then containers.
    if isinstance(obj, T):
        return _here(obj, index)
    if callable(getattr(type(obj), "to", None)):
        return False
    if isinstance(obj, (list, tuple)):
        return all(_walk(x, T, index) for x in obj)
    if isinstance(obj, dict):
        return all(_walk(x, T, index) for x in obj.values())
    if isinstance(obj, Mapping):
        return False
    if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        return False  # a UserList, a deque...: Lightning walks them, pinlane does not
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        cached = (isinstance(getattr(cls, k, None), functools.cached_property) for k in getattr(obj, "__dict__", ()))
        if any(cached):
            return False  # Lightning's copy computes it again on the device; pinlane's keeps it
        fields = dataclasses.fields(obj)
        # Lightning leaves fields with init=False as they are; pinlane moves them.
        return all(f.init for f in fields) and all(_walk(getattr(obj, f.name), T, index) for f in fields)
    return True
