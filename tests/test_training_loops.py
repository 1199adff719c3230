"""A corpus of training loops, each run four ways and compared exactly with eager ndd.

Every program (its generators and per-batch functions are in tests/training_programs.py) is a
scenario: the code a trainer runs over a few epochs (breaks, draws between steps, reseeds,
checkpoints, several ranks). It is run

    eager        as written;
    generator    its generators (or loader methods) under `ndd.compile`;
    step         its per-batch functions under `ndd.compile`, called from the eager loop;
    transparent  as written, under `ndd_trace.enabled()`;

and what the trainer observes must be identical to the eager run: every value bit for bit
(dtype, shape, layout), batch counts per epoch, logs and counters, exceptions (type, text and
the step they came at), and the default generator's state afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
import training_config
import training_programs as programs
from harness import assert_runs_match, assert_same, observe, rng_state, run

import ndd_trace
from benchmarks._data import make_jpeg_dir

MODES = ("generator", "step", "transparent")


# -- running a program four ways ---------------------------------------------------------------

class Mode:
    """How a scenario's code is run: which of its functions are compiled, or transparent mode."""

    def __init__(self, name: str):
        self.name = name
        self.compiled: list[ndd_trace.CompiledFunction] = []

    def generator(self, function: Callable) -> Callable:
        """A program's generator function, compiled in "generator" mode."""
        if self.name != "generator":
            return function
        compiled = ndd.compile(function)
        self.compiled.append(compiled)
        return compiled

    def loader(self, cls: type, method: str) -> type:
        """A loader class, with its generator method compiled in "generator" mode (a subclass
        whose body says `method = ndd.compile(Base.method)`)."""
        if self.name != "generator":
            return cls
        compiled = ndd.compile(getattr(cls, method))
        self.compiled.append(compiled)
        return type(cls.__name__, (cls,), {method: compiled})

    @contextlib.contextmanager
    def active(self):
        """Compile the per-batch functions ("step") or enable transparent mode, for a while."""
        originals = {name: getattr(programs, name) for name in programs.STEP_FUNCTIONS}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # checked-mode and capture-mode notices
            if self.name == "step":
                for name, function in originals.items():
                    compiled = ndd.compile(function)
                    self.compiled.append(compiled)
                    setattr(programs, name, compiled)
            try:
                with ndd_trace.enabled() if self.name == "transparent" else \
                        contextlib.nullcontext():
                    yield self
            finally:
                for name, function in originals.items():
                    setattr(programs, name, function)

    def paths(self) -> list[str]:
        """The path each compiled function took ("compiled loop", "checked loop", ...)."""
        return [entry.path for compiled in self.compiled for entry in compiled.entries]


plain = observe  # what the trainer can see of a value (tests/harness.py)


class Record:
    """The trainer's observations, in order."""

    def __init__(self):
        self.events: list = []

    def add(self, *items: Any) -> None:
        self.events.append(tuple(plain(item) for item in items))

    def error(self, error: BaseException, *where: Any) -> None:
        self.events.append(("raised", *where, type(error).__name__, str(error)))

    def finish(self, *extra: Any) -> list:
        self.add("rng", rng_state(), *extra)
        return self.events


@dataclasses.dataclass
class Data:
    jpeg_dir: Path  # 16 photos, two classes
    small_dir: Path  # 10 photos
    bad_dir: Path  # 15 photos and one truncated JPEG


@pytest.fixture(scope="module")
def data(jpeg_dir, tmp_path_factory) -> Data:
    small = make_jpeg_dir(tmp_path_factory.mktemp("small"), n=10, seed=1)
    bad = tmp_path_factory.mktemp("bad")
    for index, path in enumerate(sorted(Path(jpeg_dir).rglob("*.jpg"))[:15]):
        (bad / path.parent.name).mkdir(exist_ok=True)
        shutil.copy(path, bad / path.parent.name / path.name)
        if index == 6:  # a truncated copy sorts right after it
            data = path.read_bytes()
            (bad / path.parent.name / (path.stem + "_cut.jpg")).write_bytes(data[:len(data) // 5])
    return Data(Path(jpeg_dir), small, bad)


_EAGER: dict[str, list] = {}


def run_modes(scenario: Callable[[Mode, Data], list], data: Data, mode_name: str,
              expected_path: str | None = None) -> Mode:
    """Run `scenario` eagerly (once per scenario) and in `mode_name`; compare everything."""
    if scenario.__name__ not in _EAGER:
        with Mode("eager").active() as eager_mode:
            _EAGER[scenario.__name__] = scenario(eager_mode, data)
    with Mode(mode_name).active() as mode:
        observed = scenario(mode, data)
    assert_same(_EAGER[scenario.__name__], observed)
    if expected_path is not None and mode_name == "generator":
        assert set(mode.paths()) == {expected_path}, mode.paths()
    return mode


def file_reader(root: Path, seed: int = 1, **options: Any) -> Any:
    return ndd.readers.File(file_root=str(root), random_shuffle=True, seed=seed, **options)


# The scenarios, by name: each is run eagerly and in every mode by test_scenario.
SCENARIOS: dict[str, tuple[Callable[[Mode, Data], list], str | None, dict[str, str]]] = {}


def scenario(name: str, path: str | None = None, **xfails: str) -> Callable:
    """A scenario of the corpus, run by `test_scenario` as `test_scenario[name-mode]` in each
    mode: `path`, the path its compiled generators take in mode "generator" (None: not
    checked); `mode=reason`, a known mismatch (a strict xfail)."""
    def register(function: Callable[[Mode, Data], list]) -> Callable[[Mode, Data], list]:
        assert name not in SCENARIOS, name
        SCENARIOS[name] = (function, path, xfails)
        return function
    return register


def _scenarios() -> list:
    return [pytest.param(name, mode, id=f"{name}-{mode}", marks=[
        pytest.mark.xfail(strict=True, reason=xfails[mode])] if mode in xfails else [])
        for name, (_, _, xfails) in SCENARIOS.items() for mode in MODES]


# -- progressive resizing ----------------------------------------------------------------------

@scenario("progressive_resizing_by_argument", "compiled loop")
def progressive_argument(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir)
    ndd.random.set_seed(21)
    for epoch, size in enumerate([12, 16, 16, 20]):
        for images, labels in batches(reader, size):
            record.add(epoch, images, labels)
        record.add("epoch done", epoch)
    return record.finish()


@scenario("progressive_resizing_by_global", "compiled loop")
def progressive_global(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.global_sized_batches)
    reader = file_reader(data.jpeg_dir, seed=2)
    ndd.random.set_seed(22)
    try:
        for epoch, size in enumerate([12, 12, 18]):
            programs.IMAGE_SIZE = size  # the schedule callback, between epochs
            for images, labels in batches(reader):
                record.add(epoch, images, labels)
    finally:
        programs.IMAGE_SIZE = 16
    return record.finish()


@scenario("loop_body_written_in_the_generator", "compiled loop")
def inline_body(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.inline_batches)
    reader = file_reader(data.jpeg_dir, seed=3)
    ndd.random.set_seed(23)
    for epoch in range(3):
        for images, labels in batches(reader, 10 + 2 * epoch):
            record.add(epoch, images, labels)
    return record.finish()


# -- loader classes ----------------------------------------------------------------------------

@scenario("lightning_style_loader", "compiled loop")
def lightning_loader(mode: Mode, data: Data) -> list:
    record = Record()
    loader_class = mode.loader(programs.ImageLoader, "batches")
    loader = loader_class(data.jpeg_dir)
    ndd.random.set_seed(4)
    for epoch in range(3):
        record.add("len", len(loader))
        for batch_index, batch in enumerate(loader):
            record.add(epoch, batch_index, batch["image"].torch(), batch["label"].torch())
        record.add("epoch", loader.epoch, loader.size)
    return record.finish()


@scenario("loader_whose_iter_is_the_generator", "compiled loop")
def iter_is_the_generator(mode: Mode, data: Data) -> list:
    record = Record()
    log: list = []
    loader = mode.loader(programs.EpochLoader, "__iter__")(data.jpeg_dir, log)
    ndd.random.set_seed(5)
    for epoch in range(3):
        loader.size = 12 + 4 * epoch
        for step, (images, labels) in enumerate(loader):
            record.add(epoch, step, images, labels)
            if epoch == 1 and step == 1:
                break  # early stop in the middle of the second epoch
    return record.finish(log, loader.epoch)


# -- early stop --------------------------------------------------------------------------------

@scenario("early_stop_then_new_epoch", "compiled loop")
def early_stop(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=4)
    ndd.random.set_seed(6)
    for epoch in range(4):
        for step, (images, labels) in enumerate(batches(reader, 12)):
            loss = float(images.torch().mean())  # the consumer's own data-dependent stop
            record.add(epoch, step, images, labels, loss)
            if epoch == 0 and step == 1 or epoch == 2 and loss > 0.0:
                break
        record.add("epoch", epoch, step)
    return record.finish()


@scenario("epochs_cut_by_islice", "compiled loop")
def sliced_epochs(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=5)
    ndd.random.set_seed(7)
    for epoch in range(3):
        for images, labels in itertools.islice(batches(reader, 12), 3):
            record.add(epoch, images, labels)
    return record.finish()


@scenario("generator_returns_mid_epoch")
def generator_returns(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.limited_batches)
    reader = file_reader(data.jpeg_dir, seed=6)
    ndd.random.set_seed(8)
    for epoch in range(3):
        for images, labels in batches(reader, max_steps=epoch + 1):
            record.add(epoch, images, labels)
    return record.finish()


@scenario("stop_flag_set_by_the_trainer")
def stop_flag(mode: Mode, data: Data) -> list:
    record = Record()

    class Trainer:
        should_stop = False

    trainer = Trainer()
    batches = mode.generator(programs.stop_flag_batches)
    reader = file_reader(data.jpeg_dir, seed=7)
    ndd.random.set_seed(9)
    for epoch in range(3):
        trainer.should_stop = False
        for step, (images, labels) in enumerate(batches(reader, trainer)):
            record.add(epoch, step, images, labels)
            if epoch == 1 and step == 1:
                trainer.should_stop = True  # seen by the generator at its next step
    return record.finish()


# -- random draws between and around steps -----------------------------------------------------

@scenario("mixup_draws_between_steps", "compiled loop")
def mixup(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=8)
    ndd.random.set_seed(10)
    for epoch in range(2):
        for images, labels in batches(reader, 12):
            lam = float(np.asarray(ndd.random.uniform(range=[0.0, 1.0])))
            x = images.torch()
            if bool(np.asarray(ndd.random.coin_flip())):
                x = lam * x + (1 - lam) * x.flip(0)
            record.add(epoch, lam, x, labels)
    return record.finish()


@scenario("two_views_of_each_batch", "compiled loop")
def two_view(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.contrastive_batches)
    reader = file_reader(data.jpeg_dir, seed=9)
    ndd.random.set_seed(11)
    for epoch in range(2):
        for first, second in batches(reader):
            record.add(epoch, first, second)
    return record.finish()


@scenario("per_iteration_schedule_of_python_numbers")
def per_iteration_schedule(mode: Mode, data: Data) -> list:
    """More distinct Python arguments than the compile cache holds (cache_limit)."""
    record = Record()
    batches = mode.generator(programs.warmup_batches)
    reader = file_reader(data.jpeg_dir, seed=42)
    for epoch in range(3):
        for images, labels in batches(reader):
            record.add(epoch, images, labels)
    return record.finish()


@scenario("one_step_function_called_twice_a_batch", "compiled loop")
def step_called_twice(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.twice_called_batches)
    reader = file_reader(data.jpeg_dir, seed=43)
    ndd.random.set_seed(47)
    for epoch in range(3):
        for step, (first, second) in enumerate(batches(reader)):
            record.add(epoch, first, second)
            if epoch == 1 and step == 2:
                break
    return record.finish()


@scenario("reseed_between_epochs", "compiled loop")
def reseed_each_epoch(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=10, shuffle_after_epoch=False)
    for epoch in range(3):
        ndd.random.set_seed(100 + epoch % 2)
        for step, (images, labels) in enumerate(batches(reader, 12)):
            record.add(epoch, images, labels)
            if epoch == 1 and step == 0:
                break
    return record.finish()


@scenario("generator_reseeds_before_its_loop")
def generator_reseeds(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.seeded_batches)
    reader = file_reader(data.jpeg_dir, seed=11)
    for epoch in range(3):
        for images, labels in batches(reader, seed=epoch):
            record.add(epoch, images, labels)
        record.add("drawn", ndd.random.uniform(range=[0, 1]))
    return record.finish()


@scenario("explicit_random_generator", "compiled loop")
def explicit_rng(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.rng_batches)
    reader = file_reader(data.jpeg_dir, seed=12)
    rng = ndd.random.RNG(seed=9)
    ndd.random.set_seed(12)
    for epoch in range(3):
        for images, labels in batches(reader, rng):
            record.add(epoch, images, labels)
        record.add("rng", str(rng.state))
    return record.finish()


@scenario("shuffle_after_epoch_and_partial_last_batch", "compiled loop")
def shuffle_after_epoch(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = ndd.readers.File(file_root=str(data.jpeg_dir), shuffle_after_epoch=True, seed=3)
    ndd.random.set_seed(13)
    for epoch in range(3):
        for images, labels in batches(reader, 12, batch_size=5):
            record.add(epoch, images, labels)
    return record.finish()


# -- code around the loop ----------------------------------------------------------------------

@scenario("try_finally_and_with_around_the_loop", "compiled loop")
def try_finally_with(mode: Mode, data: Data) -> list:
    record = Record()
    log: list = []
    batches = mode.generator(programs.guarded_batches)
    reader = file_reader(data.jpeg_dir, seed=13, max_batch_size=programs.BATCH_SIZE)
    ndd.random.set_seed(14)
    for epoch in range(4):
        log.append(("trainer epoch", epoch))
        try:
            for step, (images, labels) in enumerate(batches(reader, log, 12)):
                record.add(epoch, step, images, labels)
                if epoch == 0 and step == 1:
                    break
                if epoch == 2 and step == 2:
                    raise ValueError("loss is NaN")
        except ValueError as error:
            record.error(error, epoch, step)
        log.append(("trainer after", epoch))
    return record.finish(log)


@scenario("side_effects_before_and_after_the_loop", "compiled loop")
def before_and_after(mode: Mode, data: Data) -> list:
    record = Record()
    log: list = []
    counters = programs.Counters()
    batches = mode.generator(programs.counted_batches)
    reader = file_reader(data.jpeg_dir, seed=14)
    ndd.random.set_seed(15)
    for epoch in range(3):
        for step, (images, labels) in enumerate(batches(reader, counters, log)):
            record.add(epoch, images, labels, counters.started, counters.finished, len(log))
            if epoch == 1 and step == 2:
                break
        record.add("counters", counters.started, counters.finished)
    return record.finish(log)


@scenario("progress_logged_inside_the_loop")
def progress_logging(mode: Mode, data: Data) -> list:
    record = Record()
    log: list = []
    batches = mode.generator(programs.logging_batches)
    reader = file_reader(data.jpeg_dir, seed=15)
    ndd.random.set_seed(16)
    for epoch in range(2):
        for images, labels in batches(reader, log):
            record.add(epoch, images, labels, len(log))
    return record.finish(log)


@scenario("generator_yields_its_step_counter")
def yields_the_step(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.numbered_batches)
    reader = file_reader(data.jpeg_dir, seed=16)
    ndd.random.set_seed(17)
    for epoch in range(2):
        for step, images, labels in batches(reader):
            record.add(epoch, step, images, labels)
    return record.finish()


@scenario("nested_helper_generators")
def nested_generators(mode: Mode, data: Data) -> list:
    record = Record()
    delegating = mode.generator(programs.delegating_batches)
    relabeled = mode.generator(programs.relabeled_batches)
    reader = file_reader(data.jpeg_dir, seed=17)
    ndd.random.set_seed(18)
    for epoch in range(2):
        for images, labels in delegating(reader, 12):
            record.add(epoch, images, labels)
        for images, labels in relabeled(reader):
            record.add(epoch, images, labels)
    return record.finish()


@scenario("new_reader_every_epoch", "compiled loop")
def fresh_reader_each_epoch(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.sized_batches)
    ndd.random.set_seed(19)
    for epoch in range(3):
        reader = file_reader(data.jpeg_dir, seed=epoch)
        for images, labels in batches(reader, 12):
            record.add(epoch, images, labels)
    return record.finish()


@scenario("train_and_validation_epochs_alternate", "compiled loop")
def train_and_validate(mode: Mode, data: Data) -> list:
    record = Record()
    train = mode.generator(programs.sized_batches)
    validate = mode.generator(programs.val_batches)
    train_reader = file_reader(data.jpeg_dir, seed=18)
    val_reader = ndd.readers.File(file_root=str(data.small_dir))
    ndd.random.set_seed(20)
    for epoch in range(2):
        for images, labels in train(train_reader, 12):
            record.add("train", epoch, images, labels)
        for images, labels in validate(val_reader):
            record.add("val", epoch, images, labels)
    return record.finish()


@scenario("outputs_kept_across_epochs_read_at_the_end", "compiled loop")
def held_outputs(mode: Mode, data: Data) -> list:
    """Outputs kept across steps and epochs and read at the end (a metric over the epoch)."""
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=25)
    ndd.random.set_seed(29)
    kept = [(epoch, images, labels, images.torch(), np.asarray(labels.select(0)))
            for epoch in range(3) for images, labels in batches(reader, 12)]
    record = Record()
    for epoch, images, labels, tensor, first_label in kept:  # views of the outputs, too
        record.add(epoch, images, labels, tensor, first_label)
    return record.finish()


@scenario("peeked_batches_before_training", "compiled loop")
def peek_one_batch(mode: Mode, data: Data) -> list:
    """`next(iter(loader))` for a shape check before training; one peek kept open."""
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=26)
    ndd.random.set_seed(30)
    images, labels = next(iter(batches(reader, 12)))
    record.add("peeked", images, labels)
    kept_open = iter(batches(reader, 12))
    record.add("second peek", *next(kept_open))
    for epoch in range(2):
        for images, labels in batches(reader, 12):
            record.add(epoch, images, labels)
    for images, labels in kept_open:  # the open epoch, finished last
        record.add("rest", images, labels)
    return record.finish()


@scenario("epochs_run_by_a_prefetch_thread", "compiled loop")
def prefetch_thread(mode: Mode, data: Data) -> list:
    """A background thread runs the epochs (a hand-written prefetcher); the trainer draws
    from its own generator as it consumes."""
    import queue
    import threading

    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=27)
    handoff: queue.Queue = queue.Queue(maxsize=2)
    ndd.random.set_seed(31)

    def produce():
        ndd.random.set_seed(32)  # the thread's own default generator
        try:
            for epoch in range(3):
                for step, (images, labels) in enumerate(batches(reader, 12)):
                    handoff.put((epoch, plain(images), plain(labels)))
                    if epoch == 1 and step == 1:
                        break
            handoff.put(("thread rng", rng_state()))
        except Exception as error:  # noqa: BLE001 (compared with eager's)
            handoff.put(("raised", type(error).__name__, str(error)))
        handoff.put(None)

    with mode.active() if mode.name == "transparent" else contextlib.nullcontext():
        worker = threading.Thread(target=produce)
        worker.start()
    record = Record()
    while (item := handoff.get()) is not None:
        record.add(*item, float(np.asarray(ndd.random.uniform(range=[0, 1]))))
    worker.join()
    return record.finish()


@scenario("config_dict_edited_between_epochs", "compiled loop")
def config_between_epochs(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.config_batches)
    reader = file_reader(data.jpeg_dir, seed=28)
    ndd.random.set_seed(33)
    try:
        for epoch in range(3):
            programs.CONFIG["size"] = 8 + 2 * epoch
            programs.CONFIG["angle"] = 5.0 + 5.0 * epoch
            for images, labels in batches(reader):
                record.add(epoch, images, labels)
    finally:
        programs.CONFIG.update(size=12, angle=10.0)
    return record.finish()


@scenario("config_module_edited_between_epochs", "compiled loop")
def config_module(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.configured_batches)
    reader = file_reader(data.jpeg_dir, seed=44)
    ndd.random.set_seed(48)
    try:
        for epoch in range(3):
            training_config.IMAGE_SIZE = 10 + 2 * epoch
            for images, labels in batches(reader):
                record.add(epoch, images, labels)
    finally:
        training_config.IMAGE_SIZE = 12
    return record.finish()


@scenario("config_dict_edited_within_an_epoch")
def config_within_epochs(mode: Mode, data: Data) -> list:
    """A per-iteration schedule: the trainer edits the config after every step."""
    record = Record()
    batches = mode.generator(programs.config_batches)
    reader = file_reader(data.jpeg_dir, seed=29)
    ndd.random.set_seed(34)
    try:
        for epoch in range(2):
            for step, (images, labels) in enumerate(batches(reader)):
                record.add(epoch, step, images, labels)
                programs.CONFIG["size"] = 8 + step
    finally:
        programs.CONFIG.update(size=12, angle=10.0)
    return record.finish()


@scenario("global_changed_within_an_epoch")
def global_within_epochs(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.global_sized_batches)
    reader = file_reader(data.jpeg_dir, seed=30)
    ndd.random.set_seed(35)
    try:
        for epoch in range(2):
            for step, (images, labels) in enumerate(batches(reader)):
                record.add(epoch, step, images, labels)
                programs.IMAGE_SIZE = 10 + 2 * step
    finally:
        programs.IMAGE_SIZE = 16
    return record.finish()


@scenario("hyperparameters_scheduled_every_step")
def hyperparameter_schedule(mode: Mode, data: Data) -> list:
    """A scheduler object's fields, read as `hparams.size` by the body, updated every step."""
    record = Record()
    batches = mode.generator(programs.scheduled_batches)
    reader = file_reader(data.jpeg_dir, seed=31)
    hparams = programs.Hyperparameters()
    ndd.random.set_seed(36)
    for epoch in range(3):
        for step, (images, labels) in enumerate(batches(reader, hparams)):
            record.add(epoch, step, images, labels)
            if epoch > 0:
                hparams.size = 8 + step
                hparams.brightness = 1.0 + 0.25 * step
    return record.finish()


@scenario("batch_size_changed_between_epochs")
def batch_size_changed(mode: Mode, data: Data) -> list:
    """A last epoch asked with another batch size: eager's ValueError, at the same step."""
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=32)
    ndd.random.set_seed(37)
    for epoch, batch_size in enumerate([4, 4, 5, 4]):
        step = 0
        try:
            for images, labels in batches(reader, 12, batch_size=batch_size):
                record.add(epoch, images, labels)
                step += 1
        except ValueError as error:
            record.error(error, epoch, step)
    return record.finish()


@scenario("invalid_size_from_the_schedule")
def invalid_size(mode: Mode, data: Data) -> list:
    """A schedule that yields an invalid crop size: the error, type and text, then recovery."""
    record = Record()
    batches = mode.generator(programs.sized_batches)
    reader = file_reader(data.jpeg_dir, seed=33)
    ndd.random.set_seed(38)
    for epoch, size in enumerate([12, -1, 12]):
        step = 0
        try:
            for images, labels in batches(reader, size):
                record.add(epoch, images, labels)
                step += 1
        except Exception as error:  # noqa: BLE001 (compared with eager's)
            record.error(error, epoch, step)
    return record.finish()


@scenario("generator_under_torch_no_grad")
def no_grad_generator(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.no_grad_batches)
    reader = file_reader(data.jpeg_dir, seed=34)
    for epoch in range(2):
        for images, labels in batches(reader):
            record.add(epoch, images.torch(), labels)
    return record.finish()


@scenario("labels_cast_in_the_loop_body", "compiled loop")
def labels_cast(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.int64_label_batches)
    reader = file_reader(data.jpeg_dir, seed=38)
    ndd.random.set_seed(43)
    for epoch in range(2):
        step = 0
        try:
            for images, labels in batches(reader, 12):
                record.add(epoch, images, labels)
                step += 1
        except Exception as error:  # noqa: BLE001 (compared with eager's)
            record.error(error, epoch, step)
    return record.finish()


@scenario("generator_bound_with_functools_partial")
def partial_generator(mode: Mode, data: Data) -> list:
    """The generator's settings bound with functools.partial before compiling."""
    import functools

    record = Record()
    batches = mode.generator(functools.partial(programs.sized_batches, size=14))
    reader = file_reader(data.jpeg_dir, seed=39)
    ndd.random.set_seed(44)
    for epoch in range(2):
        step = 0
        try:
            for images, labels in batches(reader):
                record.add(epoch, images, labels)
                step += 1
        except Exception as error:  # noqa: BLE001 (compared with eager's)
            record.error(error, epoch, step)
    return record.finish()


@scenario("sizes_sent_into_the_generator")
def curriculum(mode: Mode, data: Data) -> list:
    """The trainer sends the next size into the running epoch (`batches.send(size)`)."""
    record = Record()
    batches = mode.generator(programs.curriculum_batches)
    reader = file_reader(data.jpeg_dir, seed=40)
    ndd.random.set_seed(45)
    for epoch in range(2):
        epoch_batches = batches(reader, 10)
        images, labels = next(epoch_batches)
        try:
            for step in itertools.count():
                record.add(epoch, step, images, labels)
                images, labels = epoch_batches.send(10 + 2 * (step % 3))
        except StopIteration:
            record.add("epoch", epoch)
    return record.finish()


@scenario("compiled_decorator_returning_the_generator")
def decorated_generator(mode: Mode, data: Data) -> list:
    """`@ndd.compile` over the user's own decorator, which returns the generator."""
    record = Record()
    batches = mode.generator(programs.wrapped_batches)
    reader = file_reader(data.jpeg_dir, seed=35)
    ndd.random.set_seed(39)
    for epoch in range(3):
        for images, labels in batches(reader, 12):
            record.add(epoch, images, labels)
        record.add("epoch", epoch)
    return record.finish()


@scenario("compiled_iter_returning_the_generator")
def compiled_iter(mode: Mode, data: Data) -> list:
    """The loader's `__iter__` (which returns `self.batches()`) is what the user compiled."""
    record = Record()
    loader = mode.loader(programs.SimpleLoader, "__iter__")(data.jpeg_dir)
    ndd.random.set_seed(40)
    for epoch in range(3):
        for images, labels in loader:
            record.add(epoch, images, labels)
        record.add("epoch", epoch)
    return record.finish()


# -- several sources ---------------------------------------------------------------------------

@scenario("zip_of_two_readers", "compiled loop")
def zip_same_length(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.paired_batches)
    first, second = file_reader(data.jpeg_dir, seed=19), file_reader(data.jpeg_dir, seed=20)
    ndd.random.set_seed(24)
    for epoch in range(3):
        for step, (images, labels) in enumerate(batches(first, second)):
            record.add(epoch, images, labels)
            if epoch == 1 and step == 0:
                break
    return record.finish()


@scenario("zip_of_readers_of_different_lengths")
def zip_different_lengths(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.paired_batches)
    first, second = file_reader(data.jpeg_dir, seed=21), file_reader(data.small_dir, seed=22)
    ndd.random.set_seed(25)
    for epoch in range(3):
        for images, labels in batches(first, second):
            record.add(epoch, images, labels)
        record.add("epoch", epoch)
    return record.finish()


def _weights(count: int) -> list:
    rng = np.random.default_rng(count)
    return [ndd.as_batch([rng.uniform(0.5, 1.5, (1, 1, 1)).astype(np.float32)
                          for _ in range(programs.BATCH_SIZE)]) for _ in range(count)]


@scenario("zip_with_external_source", "DALI's capture mode")
def zip_external_source(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.weighted_batches)
    reader = file_reader(data.jpeg_dir, seed=23)
    weights = ndd.ExternalSource(_weights(6), cycle="quiet")
    ndd.random.set_seed(26)
    for epoch in range(3):
        for images, labels in batches(reader, weights):
            record.add(epoch, images, labels)
    return record.finish()


@scenario("zip_with_external_source_that_ends_first")
def external_source_ends_first(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.weighted_batches)
    reader = file_reader(data.jpeg_dir, seed=24)
    weights = ndd.ExternalSource(_weights(3), cycle="raise")
    ndd.random.set_seed(27)
    for epoch in range(3):
        for images, labels in batches(reader, weights):
            record.add(epoch, images, labels)
        record.add("epoch", epoch)
    return record.finish()


@scenario("callable_external_source_and_a_break", "DALI's capture mode")
def source_pulled_by_the_loop(mode: Mode, data: Data) -> list:
    """A callable ExternalSource logging its pulls; the trainer breaks out of the first epoch
    (how many items were pulled, and which the next epoch gets, are eager capture mode's)."""
    record = Record()
    batches = mode.generator(programs.weighted_batches)
    reader = file_reader(data.jpeg_dir, seed=36)
    pulls: list = []
    counter = itertools.count()

    def next_weights():
        index = next(counter)
        pulls.append(index)
        return ndd.as_batch([np.full((1, 1, 1), 0.5 + index / 8, np.float32)
                             for _ in range(programs.BATCH_SIZE)])

    weights = ndd.ExternalSource(next_weights)
    ndd.random.set_seed(41)
    for epoch in range(3):
        for step, (images, labels) in enumerate(batches(reader, weights)):
            record.add(epoch, step, images, labels, len(pulls))
            if epoch == 0 and step == 1:
                break
    return record.finish(pulls)


def _masks(count: int) -> list:
    rng = np.random.default_rng(count)
    return [ndd.as_batch([rng.integers(0, 3, (20, 24, 1), dtype=np.uint8)
                          for _ in range(programs.BATCH_SIZE)], layout="HWC")
            for _ in range(count)]


@scenario("segmentation_masks_from_an_external_source", "DALI's capture mode")
def segmentation(mode: Mode, data: Data) -> list:
    record = Record()
    batches = mode.generator(programs.segmentation_batches)
    reader = file_reader(data.jpeg_dir, seed=37)
    masks = ndd.ExternalSource(_masks(16), cycle="quiet")
    ndd.random.set_seed(42)
    for epoch in range(3):
        for step, (images, mask) in enumerate(batches(reader, masks)):
            record.add(epoch, images, mask)
            if epoch == 1 and step == 1:
                break
    return record.finish()


# -- shards: two ranks in one process ----------------------------------------------------------

SHARDINGS = {
    "plain": ((0, 1), 2, 3, {}),
    "stick_to_shard": ((0, 1), 2, 3, {"stick_to_shard": True}),
    "pad_last_batch": ((1, 0), 2, 3, {"pad_last_batch": True}),
    "uneven_lockstep": ((2, 0), 3, 5, {}),  # rank 2 has one batch more than rank 0
}


def sharded(sharding: str) -> Callable[[Mode, Data], list]:
    ranks, world_size, batch_size, options = SHARDINGS[sharding]

    def scenario(mode: Mode, data: Data) -> list:
        record = Record()
        loader_class = mode.loader(programs.ShardLoader, "batches")
        loaders = [loader_class(data.jpeg_dir, rank, world_size, **options) for rank in ranks]
        ndd.random.set_seed(28)
        for epoch in range(3):  # the ranks in lockstep, as DDP runs them
            for step, ((x0, y0), (x1, y1)) in enumerate(zip(
                    *(loader.batches(batch_size) for loader in loaders))):
                record.add(epoch, step, x0, y0, x1, y1)
        for loader in loaders:  # then each rank alone
            for images, labels in loader.batches(batch_size):
                record.add(loader.rank, images, labels)
        return record.finish()

    scenario.__name__ = f"sharded_{sharding}"
    return scenario


for _sharding in SHARDINGS:
    scenario(f"two_ranks_in_one_process_{_sharding}", "compiled loop")(sharded(_sharding))


# -- a corrupt file ----------------------------------------------------------------------------

@scenario("corrupt_jpeg_fails_its_step_and_the_loop_goes_on", "compiled loop")
def corrupt_jpeg(mode: Mode, data: Data, text: bool = False) -> list:
    """A truncated JPEG: its batch fails where the trainer uses it, the next ones go on. The
    errors are recorded by type and step (`text`: and their message)."""
    record = Record()
    batches = mode.generator(programs.decoded_batches)
    reader = ndd.readers.File(file_root=str(data.bad_dir))
    for epoch in range(3):
        step = 0
        try:
            for images, labels in batches(reader):
                try:
                    pixels = np.asarray(ndd.as_tensor(images))
                except RuntimeError as error:  # skip the bad batch, as trainers do
                    record.add("raised", epoch, step, type(error).__name__,
                               str(error) if text else None)
                else:
                    record.add(epoch, step, pixels, labels)
                step += 1
        except RuntimeError as error:
            record.add("raised in the loop", epoch, step, type(error).__name__,
                       str(error) if text else None)
        record.add("epoch", epoch, step)
    return record.finish()


@scenario("corrupt_jpeg_error_text_is_eagers")
def corrupt_jpeg_text(mode: Mode, data: Data) -> list:
    return corrupt_jpeg(mode, data, text=True)


@pytest.mark.parametrize("name, mode", _scenarios())
def test_scenario(data, name, mode):
    """Each scenario above, run eagerly (once) and in `mode`: what the trainer observes is the
    eager run's (`run_modes`)."""
    function, path, _ = SCENARIOS[name]
    run_modes(function, data, mode, path)


# -- checkpoints -------------------------------------------------------------------------------

def _checkpointed(mode: Mode, data: Data, record: Record, stop: int | str | None,
                  saved: tuple[str, int] | None, options: dict) -> tuple[str, int] | None:
    """Train two epochs from scratch (stopping after `stop` steps, or at the end of the first
    epoch, with a checkpoint) or from the checkpoint `saved`; returns the checkpoint and the
    epoch to go on with."""
    reader = file_reader(data.jpeg_dir, seed=7, enable_checkpointing=True, **options)
    ndd.random.set_seed(31 if saved is None else 999)
    checkpoint = ndd.checkpoint.Checkpoint()
    checkpoint.register(reader, name="reader")
    checkpoint.register(ndd.random.get_default_rng(), name="rng")
    first_epoch = 0
    if saved is not None:
        text, first_epoch = saved
        checkpoint.deserialize(text)
        checkpoint.restore()
    batches = mode.generator(programs.sized_batches)
    step = 0
    for epoch in range(first_epoch, 3):
        for images, labels in batches(reader, 12):
            record.add(epoch, step, images, labels)
            step += 1
            if step == stop:
                checkpoint.collect()
                return checkpoint.serialize(), epoch
        if stop == "epoch":  # saved at the end of the first epoch
            checkpoint.collect()
            return checkpoint.serialize(), epoch + 1
    return None


def checkpoint_scenario(saved_mode: str, restored_mode: str, stop: int | str, options: dict):
    def scenario(_: Mode, data: Data) -> list:
        record = Record()
        with Mode(saved_mode).active() as mode:
            saved = _checkpointed(mode, data, record, stop, None, options)
        record.add("restored")
        with Mode(restored_mode).active() as mode:
            _checkpointed(mode, data, record, None, saved, options)
        return record.finish()

    return scenario


CHECKPOINT_MODES = [("generator", "generator"), ("eager", "generator"), ("generator", "eager"),
                    ("step", "step"), ("transparent", "transparent"), ("step", "generator"),
                    ("generator", "transparent")]
CHECKPOINT_READERS = {"one shard": {}, "shard 1 of 2": {"shard_id": 1, "num_shards": 2},
                      "padded, stuck to shard 0 of 3": {"shard_id": 0, "num_shards": 3,
                                                        "stick_to_shard": True,
                                                        "pad_last_batch": True}}


@pytest.mark.parametrize("reader", CHECKPOINT_READERS)
@pytest.mark.parametrize("stop", [2, 6, "epoch"])
@pytest.mark.parametrize("saved_mode, restored_mode", CHECKPOINT_MODES)
def test_checkpoint_mid_epoch_restored_in_a_fresh_reader(data, saved_mode, restored_mode, stop,
                                                         reader):
    options = CHECKPOINT_READERS[reader]
    key = f"checkpoint_{stop}_{reader}"
    if key not in _EAGER:
        _EAGER[key] = checkpoint_scenario("eager", "eager", stop, options)(Mode("eager"), data)
    observed = checkpoint_scenario(saved_mode, restored_mode, stop, options)(Mode("eager"), data)
    assert_same(_EAGER[key], observed)


# -- one reader, every mode in turn -----------------------------------------------------------

MIXED_EPOCHS = ["generator", "eager", "step", "transparent", "generator", "generator in "
                "transparent", "step in transparent", "eager"]


def mixed_modes(epoch_modes: list[str], data: Data) -> list:
    """Epochs of one reader, each run its own way (a script that compiles its loop later, a
    validation pass in plain code, a transparent-mode run), breaking out of some."""
    record = Record()
    reader = file_reader(data.jpeg_dir, seed=41)
    compiled_generator = ndd.compile(programs.sized_batches)
    compiled_step = ndd.compile(programs.train_transform)

    def step_epoch(reader, size):  # the eager loop around a compiled step
        for jpegs, labels in reader.next_epoch(batch_size=programs.BATCH_SIZE):
            yield compiled_step(jpegs, size), labels

    with warnings.catch_warnings():  # (from the harness's seed)
        warnings.simplefilter("ignore")
        for epoch, name in enumerate(epoch_modes):
            batches = {"generator": compiled_generator, "step": step_epoch,
                       "eager": programs.sized_batches,
                       "transparent": programs.sized_batches}[name.split()[0]]
            with ndd_trace.enabled() if name.endswith("transparent") else \
                    contextlib.nullcontext():
                for step, (images, labels) in enumerate(batches(reader, 12)):
                    record.add(epoch, step, images, labels)
                    if epoch % 3 == 1 and step == 1:
                        break
    return record.finish()


def test_one_reader_every_mode_in_turn(data):
    eager = run(mixed_modes, ["eager"] * len(MIXED_EPOCHS), data, seed=46, warn="quiet")
    assert_runs_match(eager, run(mixed_modes, MIXED_EPOCHS, data, seed=46, warn="quiet"))
