"""Training-loop programs as PyTorch/DALI users write them, for tests/test_training_loops.py.

Each program is a generator over a reader epoch (or a loader class around one) whose loop body
calls per-batch functions marked `@step_function`. tests/test_training_loops.py runs every
program four ways: as written (eager ndd), with the generator under `ndd.compile`, with the
per-batch functions under `ndd.compile` (a compiled step called from the eager loop), and as
written under `ndd_trace.enabled()`. The code lives in a module file of its own because
ndd_trace reads a compiled generator's source from its file, as it reads users' files.
"""

from __future__ import annotations

import contextlib

import nvidia.dali.experimental.dynamic as ndd
import training_config
from nvidia.dali import types

STEP_FUNCTIONS: list[str] = []  # names of this module's per-batch functions (compiled in "step")

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
IMAGE_SIZE = 16  # progressive resizing: the trainer sets it between epochs
BATCH_SIZE = 4


def step_function(function):
    """Mark a per-batch function (the "compiled step" mode compiles it)."""
    STEP_FUNCTIONS.append(function.__name__)
    return function


# -- per-batch functions ---------------------------------------------------------------------

@step_function
def train_transform(jpegs, size):
    """ImageNet-style training augmentation: random crop, flip, normalize to CHW float."""
    images = ndd.decoders.image(jpegs)
    images = ndd.random_resized_crop(images, size=[size, size])
    flip = ndd.random.coin_flip(batch_size=images.batch_size)
    return ndd.crop_mirror_normalize(images, mirror=flip, mean=MEAN, std=STD,
                                     dtype=ndd.float32, output_layout="CHW")


@step_function
def global_size_transform(jpegs):
    """The same augmentation at the size the trainer last set (a module global)."""
    images = ndd.decoders.image(jpegs)
    images = ndd.random_resized_crop(images, size=[IMAGE_SIZE, IMAGE_SIZE])
    flip = ndd.random.coin_flip(batch_size=images.batch_size)
    return ndd.crop_mirror_normalize(images, mirror=flip, mean=MEAN, std=STD,
                                     dtype=ndd.float32, output_layout="CHW")


@step_function
def val_transform(jpegs):
    """Validation: resize and center crop, no randomness."""
    images = ndd.resize(ndd.decoders.image(jpegs), resize_shorter=20)
    return ndd.crop_mirror_normalize(images, crop=[16, 16], mean=MEAN, std=STD,
                                     dtype=ndd.float32, output_layout="CHW")


def simclr_view(images):
    """One random view of a batch (SimCLR-style): crop, flip, color jitter."""
    view = ndd.random_resized_crop(images, size=[16, 16])
    view = ndd.flip(view, horizontal=ndd.random.coin_flip(batch_size=view.batch_size))
    brightness = ndd.random.uniform(batch_size=view.batch_size, range=[0.6, 1.4])
    contrast = ndd.random.uniform(batch_size=view.batch_size, range=[0.6, 1.4])
    return ndd.brightness_contrast(view, brightness=brightness, contrast=contrast)


@step_function
def two_views(jpegs):
    """Two independent random augmentations of the same decoded batch."""
    images = ndd.decoders.image(jpegs)
    return simclr_view(images), simclr_view(images)


@step_function
def blend_pair(jpegs, other):
    """Blend each image with the matching one of a second reader (paired data)."""
    first = ndd.cast(ndd.resize(ndd.decoders.image(jpegs), size=[12, 12]), dtype=ndd.float32)
    second = ndd.cast(ndd.resize(ndd.decoders.image(other), size=[12, 12]), dtype=ndd.float32)
    weight = ndd.random.uniform(batch_size=first.batch_size, range=[0.0, 1.0])
    return first * weight + second * (1.0 - weight)


@step_function
def weighted_images(jpegs, weights):
    """Scale each image by a per-sample weight fed by an ExternalSource."""
    images = ndd.cast(ndd.resize(ndd.decoders.image(jpegs), size=[10, 10]), dtype=ndd.float32)
    return images * weights


@step_function
def rotate_with(jpegs, rng):
    """Random rotation drawn from an explicit generator (not the default one)."""
    images = ndd.resize(ndd.decoders.image(jpegs), size=[12, 12])
    angle = ndd.random.uniform(batch_size=images.batch_size, range=[-30, 30], rng=rng)
    return ndd.rotate(images, angle=angle, keep_size=True)


@step_function
def decode_small(jpegs):
    """Decode and resize, no randomness (for the corrupt-file program)."""
    return ndd.resize(ndd.decoders.image(jpegs), size=[8, 8])


# -- generators over one reader ----------------------------------------------------------------

def sized_batches(reader, size, batch_size=BATCH_SIZE):
    """Progressive resizing, the size passed by the trainer each epoch."""
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        yield train_transform(jpegs, size), labels


def global_sized_batches(reader):
    """Progressive resizing, the size read from a module global the trainer sets."""
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield global_size_transform(jpegs), labels


def inline_batches(reader, size):
    """The loop body written out in the generator (nothing for the step mode to compile)."""
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        images = ndd.decoders.image(jpegs)
        images = ndd.random_resized_crop(images, size=[size, size])
        angle = ndd.random.uniform(batch_size=images.batch_size, range=[-15, 15])
        yield ndd.rotate(images, angle=angle, keep_size=True), labels


def val_batches(reader):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield val_transform(jpegs), labels


def contrastive_batches(reader):
    for jpegs, _ in reader.next_epoch(batch_size=BATCH_SIZE):
        first, second = two_views(jpegs)
        yield first, second


def limited_batches(reader, max_steps):
    """Stops the epoch itself after `max_steps` steps (a debug/"fast dev run" limit)."""
    for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=BATCH_SIZE)):
        if step == max_steps:
            return
        yield train_transform(jpegs, 16), labels


def logging_batches(reader, log, every=2):
    """Logs every `every` steps from inside the loop, as training scripts print progress."""
    for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=BATCH_SIZE)):
        if step % every == 0:
            log.append(("progress", step))
        yield train_transform(jpegs, 16), labels


def seeded_batches(reader, seed):
    """Reseeds the default generator itself at the start of every epoch."""
    ndd.random.set_seed(seed)
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield train_transform(jpegs, 16), labels


def rng_batches(reader, rng):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield rotate_with(jpegs, rng), labels


def decoded_batches(reader):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield decode_small(jpegs), labels


def stop_flag_batches(reader, trainer):
    """Ends the epoch when the trainer (the consumer) sets `should_stop` (Lightning-style)."""
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        if trainer.should_stop:
            return
        yield train_transform(jpegs, 16), labels


# -- code around the loop --------------------------------------------------------------------

@contextlib.contextmanager
def timed(log, name):
    """A timing context as training scripts use (here it logs instead of timing)."""
    log.append(("enter", name))
    try:
        yield
    finally:
        log.append(("exit", name))


def guarded_batches(reader, log, size):
    """try/finally and with around the loop, code before and after it."""
    log.append(("epoch start", size))
    try:
        with timed(log, "epoch"):
            for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
                yield train_transform(jpegs, size), labels
        log.append("loop done")
    finally:
        log.append("epoch end")


class Counters:
    """What a trainer counts around its epochs."""

    def __init__(self):
        self.started = 0
        self.finished = 0


def counted_batches(reader, counters, log):
    counters.started += 1
    log.append(("begin", counters.started))
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield train_transform(jpegs, 16), labels
    counters.finished += 1
    log.append(("done", counters.finished))


# -- several sources ---------------------------------------------------------------------------

def paired_batches(images, others):
    for (jpegs, labels), (other, _) in zip(images.next_epoch(batch_size=BATCH_SIZE),
                                           others.next_epoch(batch_size=BATCH_SIZE)):
        yield blend_pair(jpegs, other), labels


def weighted_batches(reader, weights):
    for (jpegs, labels), weight in zip(reader.next_epoch(batch_size=BATCH_SIZE),
                                       weights.captured(batch_size=BATCH_SIZE)):
        yield weighted_images(jpegs, weight), labels


def numbered_batches(reader):
    for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=BATCH_SIZE)):
        yield step, train_transform(jpegs, 16), labels


# -- loader classes ----------------------------------------------------------------------------

class ImageLoader:
    """A Lightning-style DataLoader replacement: `iter(loader)` starts an epoch."""

    sizes = (12, 16, 20)

    def __init__(self, root, batch_size=BATCH_SIZE, **reader_options):
        self.reader = ndd.readers.File(file_root=str(root), random_shuffle=True, seed=5,
                                       max_batch_size=batch_size, **reader_options)
        self.batch_size = batch_size
        self.epoch = 0
        self.size = self.sizes[0]

    def __len__(self):
        return -(-self.reader.get_metadata()["epoch_size"] // self.batch_size)

    def __iter__(self):
        self.epoch += 1
        self.size = self.sizes[min(self.epoch, len(self.sizes)) - 1]
        return self.batches()

    def batches(self):
        for jpegs, labels in self.reader.next_epoch(batch_size=self.batch_size):
            yield {"image": train_transform(jpegs, self.size), "label": labels}


class SimpleLoader:
    """A loader whose `__iter__` returns its generator method's generator."""

    def __init__(self, root, size=12):
        self.reader = ndd.readers.File(file_root=str(root), random_shuffle=True, seed=6)
        self.size = size

    def __iter__(self):
        return self.batches()

    def batches(self):
        for jpegs, labels in self.reader.next_epoch(batch_size=BATCH_SIZE):
            yield train_transform(jpegs, self.size), labels


class EpochLoader:
    """A loader whose `__iter__` is itself the generator (compiled in "generator" mode)."""

    def __init__(self, root, log):
        self.reader = ndd.readers.File(file_root=str(root), random_shuffle=True, seed=8)
        self.log = log
        self.epoch = 0
        self.size = 12

    def __iter__(self):
        self.epoch += 1
        self.log.append(("epoch", self.epoch))
        for jpegs, labels in self.reader.next_epoch(batch_size=BATCH_SIZE):
            yield train_transform(jpegs, self.size), labels


class ShardLoader:
    """One data-parallel rank's loader."""

    def __init__(self, root, rank, world_size, **options):
        self.reader = ndd.readers.File(file_root=str(root), random_shuffle=True, seed=3,
                                       shard_id=rank, num_shards=world_size, **options)
        self.rank = rank

    def batches(self, batch_size):
        for jpegs, labels in self.reader.next_epoch(batch_size=batch_size):
            yield train_transform(jpegs, 12), labels


# -- nested generators -------------------------------------------------------------------------

def delegating_batches(reader, size):
    """A wrapper generator delegating to the real one (`yield from`)."""
    yield from sized_batches(reader, size)


def relabeled_batches(reader):
    """A generator looping over another generator's batches, changing the labels."""
    for images, labels in sized_batches(reader, 12):
        yield images, labels + 100


# -- configuration read by the loop body -------------------------------------------------------

CONFIG = {"size": 12, "angle": 10.0}  # a config dict the trainer edits between epochs


def config_batches(reader):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[CONFIG["size"], CONFIG["size"]])
        angle = ndd.random.uniform(batch_size=images.batch_size,
                                   range=[-CONFIG["angle"], CONFIG["angle"]])
        yield ndd.rotate(images, angle=angle, keep_size=True), labels


class Hyperparameters:
    """A hyperparameter object whose fields a scheduler updates."""

    def __init__(self, size=12, brightness=1.0):
        self.size = size
        self.brightness = brightness


def scheduled_batches(reader, hparams):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[hparams.size, hparams.size])
        yield ndd.brightness_contrast(images, brightness=hparams.brightness), labels


# -- decorated generators ----------------------------------------------------------------------

def log_epochs(function):
    """A user decorator around a generator function (it returns the generator)."""
    import functools

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    return wrapper


wrapped_batches = log_epochs(sized_batches)


def _no_grad(function):
    import torch

    return torch.no_grad()(function)


@_no_grad
def no_grad_batches(reader):
    """A generator under `torch.no_grad()` (torch wraps generator functions specially)."""
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield val_transform(jpegs), labels


# -- more loop bodies --------------------------------------------------------------------------

def int64_label_batches(reader, size):
    """Labels cast for the loss function, rebinding the loop's own target."""
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        labels = ndd.cast(labels, dtype=ndd.int64)
        yield train_transform(jpegs, size), labels


@step_function
def image_and_mask(jpegs, masks):
    """Segmentation: the same random flip for an image and its mask."""
    images = ndd.resize(ndd.decoders.image(jpegs), size=[12, 12])
    masks = ndd.resize(masks, size=[12, 12], interp_type=types.INTERP_NN)
    flip = ndd.random.coin_flip(batch_size=images.batch_size)
    return ndd.flip(images, horizontal=flip), ndd.flip(masks, horizontal=flip)


def segmentation_batches(reader, masks):
    """Images from a reader, their masks from an ExternalSource."""
    for (jpegs, _), mask in zip(reader.next_epoch(batch_size=BATCH_SIZE),
                                masks.captured(batch_size=BATCH_SIZE)):
        yield image_and_mask(jpegs, mask)


def curriculum_batches(reader, size):
    """The trainer sends the next image size into the generator (`generator.send(size)`)."""
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        requested = yield train_transform(jpegs, size), labels
        if requested is not None:
            size = requested


@step_function
def rotate_by(jpegs, angle):
    """A rotation whose angle the schedule gives each iteration (a Python float)."""
    images = ndd.resize(ndd.decoders.image(jpegs), size=[12, 12])
    return ndd.rotate(images, angle=angle, keep_size=True)


def warmup_batches(reader):
    """A per-iteration schedule: the step gets another Python number every iteration."""
    for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=BATCH_SIZE)):
        yield rotate_by(jpegs, 3.0 * step), labels


@step_function
def one_view(jpegs):
    images = ndd.decoders.image(jpegs)
    return simclr_view(images)


def twice_called_batches(reader):
    """The same per-batch function called twice on each batch (two random views)."""
    for jpegs, _ in reader.next_epoch(batch_size=BATCH_SIZE):
        yield one_view(jpegs), one_view(jpegs)


@step_function
def configured_transform(jpegs):
    """The size read from the configuration module at every call."""
    images = ndd.resize(ndd.decoders.image(jpegs), size=[training_config.IMAGE_SIZE] * 2)
    return ndd.flip(images, horizontal=ndd.random.coin_flip(batch_size=images.batch_size))


def configured_batches(reader):
    for jpegs, labels in reader.next_epoch(batch_size=BATCH_SIZE):
        yield configured_transform(jpegs), labels
