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
launchers and ``torchrun``; the mixin hands any other device to Lightning's own hook.
Batches are the containers ``transfer_tensor_h2d`` walks (lists, tuples, namedtuples,
dicts, dataclasses) of torch tensors; other objects in them come back as they are, so a
batch of objects that move themselves with ``.to()`` needs Lightning's hook. Importing this
module needs neither Lightning nor torch.
"""

from . import _native, transfer_tensor_h2d

__all__ = ["PinlaneTransfer"]


class PinlaneTransfer:
    """A ``LightningModule`` mixin whose ``transfer_batch_to_device`` moves batches with
    ``pinlane.transfer_tensor_h2d`` when the target is pinlane's device
    (``cuda:{LOCAL_RANK}``), and with the next class's hook otherwise."""

    #: ``num_caches`` of each move: the last batches whose device memory the thread keeps.
    pinlane_num_caches = 4

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if device.type == "cuda" and (device.index is None or device.index == _native.default_device()):
            return transfer_tensor_h2d(batch, num_caches=self.pinlane_num_caches)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)
