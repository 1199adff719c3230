"""Multi-GPU training with DistributedDataParallel and a compiled, prefetching loader per rank.

    torchrun --nproc_per_node=2 examples/ddp_train.py              # one GPU per rank (NCCL)
    torchrun --nproc_per_node=2 examples/ddp_train.py --device cpu # CPU only (gloo), for tests

Each rank owns a reader shard (`shard_id=rank, num_shards=world_size`) inside the pipeline of a
compiled generator on its own GPU. Each epoch, rank 0 checks that the ranks together saw every
image of the dataset exactly once, and prints the loss.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nvidia.dali.experimental.dynamic as ndd  # noqa: E402

import ndd_trace  # noqa: E402,F401
from benchmarks._data import jpeg_paths, make_jpeg_dir  # noqa: E402

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def make_loader(device: str, device_id: int | None, size: int):
    @ndd.compile(device_id=device_id)
    def loader(reader, batch_size):
        for jpegs, labels in reader.next_epoch(batch_size=batch_size):
            images = ndd.decoders.image(jpegs, device=device)
            images = ndd.random_resized_crop(images, size=[size, size])
            flip = ndd.random.coin_flip(batch_size=images.batch_size)
            images = ndd.crop_mirror_normalize(images, mirror=flip, mean=MEAN, std=STD)
            yield images, labels, jpegs

    return loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    gpu = args.device == "gpu"
    if gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if gpu else "gloo")
    torch_device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")

    root = os.path.join(tempfile.gettempdir(), "ndd_trace_ddp_photos")
    if rank == 0:
        make_jpeg_dir(root, n=args.images)
    dist.barrier()
    all_files = {hashlib.sha256(p.read_bytes()).hexdigest() for p in jpeg_paths(root)}

    ndd.random.set_seed(1000 + rank)
    reader = ndd.readers.File(file_root=root, random_shuffle=True, seed=5, shard_id=rank,
                              num_shards=world, pad_last_batch=True)
    loader = make_loader(args.device, local_rank if gpu else None, args.size)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 2)).to(torch_device)
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank] if gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    for epoch in range(args.epochs):
        seen = []
        for images, labels, jpegs in loader(reader, args.batch_size):
            batch = images.torch()  # on this rank's GPU, no copy
            assert batch.device == torch_device, batch.device
            target = labels.torch().to(torch_device).long().view(-1)
            loss = torch.nn.functional.cross_entropy(model(batch), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += [hashlib.sha256(np.asarray(j).tobytes()).hexdigest() for j in jpegs]
        gathered = [None] * world
        dist.all_gather_object(gathered, seen)
        if rank == 0:
            union = [h for part in gathered for h in part]
            assert set(union) == all_files, "the ranks together missed or invented images"
            print(f"epoch {epoch}: {len(union)} samples over {world} ranks "
                  f"({len(set(union))} distinct of {len(all_files)}), loss {loss.item():.4f}",
                  flush=True)
    if rank == 0:
        print(f"compiled loader: {loader.cache_info()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
