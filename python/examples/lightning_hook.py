"""PyTorch Lightning with pinlane moving the batches (GPU machine):

    python python/examples/lightning_hook.py            # trains with pinlane's hook
    python python/examples/lightning_hook.py --compare  # and with Lightning's, and compares

A small classifier trains on synthetic images and labels from a plain DataLoader (pageable
batches, `pin_memory=False`). With `--compare` it trains twice from the same seed with
deterministic algorithms, once with Lightning's default `transfer_batch_to_device` and
once with `pinlane.lightning.PinlaneTransfer`, and checks that every step's loss and the
final weights are bit-identical (python/tests/test_integrations_gpu.py runs this).
"""

import argparse
import os
import time

import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

try:  # the `lightning` package, or `pytorch-lightning`
    import lightning.pytorch as pl  # noqa: E402
except ImportError:  # pragma: no cover
    import pytorch_lightning as pl  # noqa: E402

from pinlane.lightning import PinlaneTransfer  # noqa: E402


class Images(torch.utils.data.Dataset):
    """Synthetic uint8 images and labels, the same for a given index every time."""

    def __init__(self, n=512):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=g)
        return {"image": image, "label": torch.tensor(i % 10)}


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )
        self.losses = []
        self.transfer_s = []  # seconds in transfer_batch_to_device, per batch

    def training_step(self, batch, _):
        x = batch["image"].float() / 255
        loss = torch.nn.functional.cross_entropy(self.net(x), batch["label"])
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    # Lightning calls these right before and after `transfer_batch_to_device`: they time
    # whichever hook moves the batch, once per batch.
    def on_before_batch_transfer(self, batch, dataloader_idx):
        self._t0 = time.perf_counter()
        return batch

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.transfer_s.append(time.perf_counter() - self._t0)
        return batch


class PinlaneClassifier(PinlaneTransfer, Classifier):
    """The same module, its batches moved by pinlane (the mixin first)."""


def train(use_pinlane, steps=60, seed=0):
    """Trains `steps` steps; returns the module (losses, weights, time in the hook)."""
    pl.seed_everything(seed, workers=True)
    torch.use_deterministic_algorithms(True)
    model = PinlaneClassifier() if use_pinlane else Classifier()
    loader = torch.utils.data.DataLoader(Images(), batch_size=32, shuffle=True, num_workers=2,
                                         pin_memory=False, persistent_workers=False)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=steps, max_epochs=-1, deterministic=True,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    return model


def hook_ms(model):
    """The hook's time per batch: median, and the first call (which sets things up)."""
    t = sorted(model.transfer_s[1:]) or [0.0]
    return (f"hook median {t[len(t) // 2] * 1e3:.3f} ms per batch "
            f"(first call {model.transfer_s[0] * 1e3:.1f} ms)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    ours = train(True, args.steps)
    print(f"pinlane hook: {len(ours.losses)} steps, last loss {ours.losses[-1].item():.4f}, {hook_ms(ours)}")
    if not args.compare:
        return
    theirs = train(False, args.steps)
    print(f"default hook: {len(theirs.losses)} steps, last loss {theirs.losses[-1].item():.4f}, {hook_ms(theirs)}")
    same_losses = torch.equal(torch.stack(ours.losses), torch.stack(theirs.losses))
    same_weights = all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    print(f"identical losses: {same_losses}; identical weights: {same_weights}")
    if not (same_losses and same_weights):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
