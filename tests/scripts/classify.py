"""Image classification loop with PyTorch: reader, decode, augment, .torch(), a tiny model."""

import argparse

import torch
from _common import digest, photo_dir

import nvidia.dali.experimental.dynamic as ndd

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ndd.random.set_seed(3)
reader = ndd.readers.File(file_root=photo_dir(), random_shuffle=True, seed=5)
for epoch in range(args.epochs):
    for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=4)):
        images = ndd.decoders.image(jpegs)
        images = ndd.random_resized_crop(images, size=[32, 32])
        flip = ndd.random.coin_flip(batch_size=images.batch_size)
        images = ndd.crop_mirror_normalize(images, mirror=flip, mean=MEAN, std=STD)
        batch = images.torch()
        digest(f"epoch {epoch} step {step} images", batch)
        loss = torch.nn.functional.cross_entropy(model(batch), labels.torch().long().view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.6f}")
