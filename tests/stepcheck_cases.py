"""Generators for tests/test_stepcheck.py (a module file: ndd_trace reads their source)."""
import random

import numpy as np
import nvidia.dali.experimental.dynamic as ndd

MEAN = [1, 2, 3]


def helper(x, s):
    y = ndd.resize(x, size=[s, s])
    return ndd.flip(y, horizontal=1)


def noisy_helper(x):
    print("x")
    return x


def plain(reader, size=16):
    """doc"""
    for jpegs, labels in reader.next_epoch(batch_size=4):
        images = ndd.decoders.image(jpegs)
        images = ndd.resize(images, size=[size, size])
        images = helper(images, size)
        yield images.cpu(), labels


def plain_zip_branch_on_argument(reader, other, flip=True):
    for (a, b), (c, d) in zip(reader.next_epoch(batch_size=4), other.next_epoch(batch_size=4)):
        if flip:
            a = ndd.flip(a, horizontal=1)
        yield ndd.cast(a, dtype=ndd.float32) * MEAN[0], np.float32(2) * c


def counter(reader):
    for i, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=4)):
        if i % 2 == 0:
            jpegs = ndd.cast(jpegs, dtype=ndd.float32)
        yield jpegs


def appends(reader, out):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        out.append(1)
        yield jpegs


def augassign_break(reader):
    step = 0
    for jpegs, labels in reader.next_epoch(batch_size=4):
        step += 1
        if step == 3:
            break
        yield jpegs


def calls_impure_helper(reader):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        yield noisy_helper(jpegs)


def after_loop(reader):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        yield jpegs
    print("done")


def python_random(reader):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        yield ndd.flip(ndd.decoders.image(jpegs), horizontal=random.randint(0, 1))


def method_of_argument(self, reader):
    for jpegs, labels in reader.next_epoch(batch_size=4):
        yield self.aug(jpegs)


def counted_augment(reader, seen):
    for i, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=2)):
        seen.append(i)
        images = ndd.decoders.image(jpegs)
        yield ndd.flip(images, horizontal=ndd.random.coin_flip(batch_size=2))
