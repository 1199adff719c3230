"""Worker for the checkpoint test: run a compiled reader loop, save or restore mid-epoch.

    python checkpoint_worker.py MODE full DIR            # two epochs, uninterrupted
    python checkpoint_worker.py MODE save DIR CKPT STOP  # stop after STOP steps, save a checkpoint
    python checkpoint_worker.py MODE resume DIR CKPT     # restore, then the epochs left
MODE is `compiled` (the loop is @ndd.compile'd) or `eager`. Prints one digest line per batch.
"""

import hashlib
import sys

import numpy as np

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace  # noqa: F401


def augmented(reader):
    for jpegs, labels in reader.next_epoch(batch_size=3):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
        angle = ndd.random.uniform(batch_size=images.batch_size, range=[-30, 30])
        yield ndd.rotate(images, angle=angle, keep_size=True), labels


def digest(step, images, labels):
    data = np.asarray(ndd.as_tensor(images)).tobytes() + np.asarray(
        ndd.as_tensor(labels)).tobytes()
    print(step, hashlib.sha256(data).hexdigest()[:16], flush=True)


if sys.argv[1] == "compiled":
    augmented = ndd.compile(augmented)
mode, root = sys.argv[2], sys.argv[3]
sys.argv = sys.argv[1:]
reader = ndd.readers.File(file_root=root, random_shuffle=True, seed=7, enable_checkpointing=True)
rng = ndd.random.RNG(seed=11)
ndd.random.get_default_rng().state = rng.state
checkpoint = ndd.checkpoint.Checkpoint()
checkpoint.register(reader, name="reader")
checkpoint.register(ndd.random.get_default_rng(), name="rng")
epochs_done = 0
if mode == "resume":
    checkpoint.deserialize(open(sys.argv[3]).read())
    checkpoint.restore()
    epochs_done = int(open(sys.argv[3] + ".epoch").read())
step = 0
for epoch in range(epochs_done, 2):
    for images, labels in augmented(reader):
        digest(f"{epoch}:{step}", images, labels)
        step += 1
        if mode == "save" and step == int(sys.argv[4]):
            checkpoint.collect()
            open(sys.argv[3], "w").write(checkpoint.serialize())
            open(sys.argv[3] + ".epoch", "w").write(str(epoch))
            sys.exit(0)
