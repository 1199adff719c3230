"""PyTorch Lightning over a compiled loop, checkpointed mid-epoch and resumed exactly.

    python examples/lightning_train.py                                  # 10 steps on the CPU
    python examples/lightning_train.py --save-at 6 --checkpoint run.ckpt   # stop at step 6
    python examples/lightning_train.py --resume run.ckpt                # steps 7..10, as if never
                                                                        # stopped
The DataModule's `train_dataloader()` is a torchdata Loader over `ndd_trace.nodes.Loop`: a
compiled generator whose state (reader position, random generators, batches left in the epoch)
Lightning saves in its checkpoints with the model's and restores with them. Each step prints
its batch's digest and the loss; `--device gpu` decodes on the GPU.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nvidia.dali.experimental.dynamic as ndd  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torchdata.nodes as tn  # noqa: E402

import ndd_trace  # noqa: E402,F401
from benchmarks._data import make_jpeg_dir  # noqa: E402
from ndd_trace.nodes import Loader, Loop, to_torch  # noqa: E402

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


@ndd.compile
def train_batches(reader, device="cpu", size=32, batch_size=4):
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        images = ndd.decoders.image(jpegs, device=device)
        images = ndd.random_resized_crop(images, size=[size, size])
        flip = ndd.random.coin_flip(batch_size=images.batch_size)
        images = ndd.crop_mirror_normalize(images, mirror=flip, mean=MEAN, std=STD)
        yield images, labels


class Photos(pl.LightningDataModule):
    """Photos from a folder, decoded and augmented by a compiled loop (one per fit)."""

    def __init__(self, root: str, images: int, device: str, batch_size: int = 4):
        super().__init__()
        self.root = root
        self.images = images
        self.device = device
        self.batch_size = batch_size

    def train_dataloader(self) -> Loader:
        # a reader made here: a resumed fit restores its position into a reader not read yet
        reader = ndd.readers.File(file_root=self.root, random_shuffle=True, seed=5)
        loop = Loop(functools.partial(train_batches, device=self.device,
                                      batch_size=self.batch_size), reader)
        # the length (batches per epoch) keeps Lightning from fetching a batch ahead, which
        # would be in the state it saves but not in the steps it took
        return Loader(tn.Mapper(loop, to_torch), length=-(-self.images // self.batch_size))


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(8, 2))

    def training_step(self, batch, batch_index):
        images, labels = batch
        images = images.float()
        digest = hashlib.sha256(images.cpu().numpy().tobytes()).hexdigest()[:16]
        loss = torch.nn.functional.cross_entropy(self.model(images), labels.long().flatten())
        print(f"step {self.global_step + 1} epoch {self.current_epoch} batch {digest} "
              f"loss {loss.item():.6f}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class SaveAt(pl.Callback):
    """Save a checkpoint after step `step` and stop (as a job that is preempted)."""

    def __init__(self, step: int, path: str):
        self.step = step
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["gpu", "cpu"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--save-at", type=int, help="save a checkpoint after this step, stop")
    parser.add_argument("--checkpoint", default="lightning_run.ckpt")
    parser.add_argument("--resume", metavar="CKPT", help="resume from this checkpoint")
    args = parser.parse_args(argv)

    root = os.path.join(tempfile.gettempdir(), "ndd_trace_lightning_photos")
    make_jpeg_dir(root, n=args.images)
    pl.seed_everything(0, verbose=False)
    ndd.random.set_seed(1)  # (restored from the checkpoint when resuming)
    callbacks = [SaveAt(args.save_at, args.checkpoint)] if args.save_at else []
    trainer = pl.Trainer(accelerator="gpu" if args.device == "gpu" else "cpu", devices=1,
                         max_steps=args.steps, callbacks=callbacks, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Classifier(), datamodule=Photos(root, args.images, args.device),
                ckpt_path=args.resume)
    weights = torch.cat([p.detach().cpu().flatten()
                         for p in trainer.lightning_module.parameters()])
    print(f"weights {hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
