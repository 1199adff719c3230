"""Multi-GPU scaling of the train workload under torchrun: one sharded loader per rank, per mode.

For each N in ``--gpus`` (capped at the GPUs present; ``--device cpu``: N CPU processes over gloo)
and each mode in ``--modes``, the launcher runs::

    python -m torch.distributed.run --standalone --nproc_per_node=N benchmarks/bench_ddp.py \\
        --worker MODE ...

Each rank (``torch.cuda.set_device(LOCAL_RANK)``, NCCL on the GPU) reads its shard of real JPEGs
with the File reader (``shard_id=rank, num_shards=world, random_shuffle=True,
pad_last_batch=True``) and runs the train workload of ``bench_ops.py`` (``decode_rrc_cmn``, GPU
variant: decode on the GPU, ``random_resized_crop`` to 224x224, ``crop_mirror_normalize`` with a
random mirror), then ``.torch()`` of the images and the labels and a CUDA synchronization per
step, for ``--epochs`` epochs; the first ``--warmup-epochs`` (1) warm up, the others are timed.
Modes:

- ``pipeline``: a hand-written ``@pipeline_def`` with ``fn.readers.file(shard_id=rank,
  num_shards=world, ...)``, mixed decode and the same operators, ``pipe.run()`` per step.
- ``capture``: DALI's capture mode, ``reader.next_epoch(batch_size=..., capture=True)``.
- ``compiled``: an ``@ndd.compile`` generator over the reader (the loader of
  ``examples/ddp_train.py``).
- ``optimize``: the same generator compiled with ``optimize=True``; offered only when
  ``ndd_trace.compile`` takes an ``optimize`` argument (checked with ``inspect.signature``).
- ``transparent``: the ``eager`` loop unmodified, every rank started with ``NDD_TRACE=1``.
- ``eager``: plain DALI dynamic mode (not in the default list).

The shard check: the data set's file list gives every file its own label (its index in the
list), so a rank's labels name the files it read. Each epoch every rank all-gathers its labels
and rank 0 checks that the union is the data set, that no file is in two ranks' shards, that
each rank's distinct files are one whole shard (DALI's split sizes), that every rank ran the same
number of steps (else DDP would hang), and that the only repeats are ``pad_last_batch``'s: one
sample repeated up to ``ceil(largest shard / batch) * batch`` samples per rank.

Throughput: each timed epoch starts after a barrier; its time is the slowest rank's (as in
synchronous data-parallel training). Total img/s = images of all ranks in the timed epochs /
the sum of those epoch times. The table gives it per (N, mode), the scaling against N = 1 of the
same mode and the ratio to ``pipeline`` at the same N.

Example::

    python benchmarks/bench_ddp.py                                  # every GPU count up to 8
    python benchmarks/bench_ddp.py --gpus 1 --json /tmp/ddp.json    # one GPU
    python benchmarks/bench_ddp.py --device cpu --gpus 2 --images 64 --batch-size 8 --threads 1
"""

from __future__ import annotations

import os
import sys

# NDD_TRACE=1 acts through ndd_trace.pth in site-packages, read at start-up. A checkout used
# through PYTHONPATH has none: do here what that one line does, before DALI is imported.
if os.environ.get("NDD_TRACE", "").strip().lower() not in ("", "0", "false", "no", "off") \
        and "_ndd_trace_hook" not in sys.modules:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import _ndd_trace_hook

    _ndd_trace_hook.install()
    HOOK_SOURCE = "bench_ddp.py (ndd_trace.pth not installed)"
else:
    HOOK_SOURCE = "ndd_trace.pth" if "_ndd_trace_hook" in sys.modules else None

import argparse  # noqa: E402
import collections  # noqa: E402
import hashlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

BENCHMARK_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARK_DIR.parent
if str(BENCHMARK_DIR) not in sys.path:
    sys.path.insert(0, str(BENCHMARK_DIR))

import nvidia.dali.experimental.dynamic as ndd  # noqa: E402
from _data import jpeg_paths, make_jpeg_dir  # noqa: E402
from bench_ops import decode_rrc_cmn_cpu, decode_rrc_cmn_gpu  # noqa: E402

MODES = ("pipeline", "capture", "compiled", "optimize", "transparent", "eager")
DEFAULT_MODES = ("pipeline", "capture", "compiled", "transparent")  # + optimize where it exists
COMPILED_MODES = ("compiled", "optimize")
RESULT_FILE = "rank{rank}.json"
FILE_LIST_NAME = ".bench_ddp_file_list.txt"
SCALING_GOALS = {2: 1.9, 4: 3.7, 8: 7.2}  # the goals for the compiled generator


# --------------------------------------------------------------------------------------------
# Data: the JPEG directory and a file list that gives every file its own label.
# --------------------------------------------------------------------------------------------


def default_data_dir(images: int, seed: int) -> str:
    """The JPEG directory bench_ops.py uses for the same count and seed (shared cache)."""
    return str(Path(tempfile.gettempdir()) / f"ndd_trace_bench_jpegs_{images}_{seed}")


def prepare_data(data_dir: str, images: int, seed: int) -> tuple[Path, int]:
    """Make the JPEGs (once) and the file list (label = index); return (list path, count)."""
    root = make_jpeg_dir(data_dir, n=images, seed=seed)
    paths = jpeg_paths(root)
    lines = "".join(f"{path.relative_to(root).as_posix()} {index}\n"
                    for index, path in enumerate(paths))
    file_list = root / FILE_LIST_NAME
    if not file_list.exists() or file_list.read_text() != lines:
        partial = file_list.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(lines)
        partial.replace(file_list)  # atomic: a rank never reads half a list
    return file_list, len(paths)


# --------------------------------------------------------------------------------------------
# The shard check (pure Python: rank 0 runs it on the labels every rank saw in one epoch).
# --------------------------------------------------------------------------------------------


def shard_sizes(dataset_size: int, world: int) -> list[int]:
    """The shard sizes DALI's readers split `dataset_size` samples into (floor boundaries)."""
    return [dataset_size * (shard + 1) // world - dataset_size * shard // world
            for shard in range(world)]


def check_shards(per_rank_labels: list[list[int]], dataset_size: int, batch_size: int) -> dict:
    """Check one epoch's labels of every rank against the data set; return the findings."""
    world = len(per_rank_labels)
    sizes = shard_sizes(dataset_size, world)
    expected_seen = math.ceil(max(sizes) / batch_size) * batch_size
    problems = []
    distinct = [set(labels) for labels in per_rank_labels]
    union = set().union(*distinct)
    missing = dataset_size - len(union & set(range(dataset_size)))
    unknown = len(union - set(range(dataset_size)))
    in_two_shards = sum(len(labels) for labels in distinct) - len(union)
    if missing:
        problems.append(f"{missing} of {dataset_size} files read by no rank")
    if unknown:
        problems.append(f"{unknown} labels not in the data set")
    if in_two_shards:
        problems.append(f"{in_two_shards} files read by more than one rank")
    if sorted(len(labels) for labels in distinct) != sorted(sizes):
        problems.append(f"distinct files per rank {[len(labels) for labels in distinct]}, "
                        f"DALI's shard sizes {sizes}")
    steps = [len(labels) // batch_size for labels in per_rank_labels]
    if len(set(steps)) > 1:
        problems.append(f"unequal steps per rank {steps} (DDP would hang)")
    repeats = []
    for rank, labels in enumerate(per_rank_labels):
        repeated = {label: count - 1 for label, count in collections.Counter(labels).items()
                    if count > 1}
        extra = sum(repeated.values())
        repeats.append(extra)
        if len(labels) != expected_seen:
            problems.append(f"rank {rank}: {len(labels)} samples, pad_last_batch gives "
                            f"{expected_seen} (ceil({max(sizes)} / {batch_size}) batches)")
        if len(repeated) > 1:
            problems.append(f"rank {rank}: {len(repeated)} different files repeated "
                            f"({extra} repeats); pad_last_batch repeats one")
    return {"ok": not problems, "problems": problems, "samples_per_rank":
            [len(labels) for labels in per_rank_labels], "distinct_per_rank":
            [len(labels) for labels in distinct], "padding_per_rank": repeats,
            "shard_sizes": sizes}


def digest(labels) -> str:
    """A short SHA-256 digest of a sequence of labels."""
    return hashlib.sha256(json.dumps(list(labels)).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Worker: one mode in one rank of a torchrun job.
# --------------------------------------------------------------------------------------------


def train_epoch_gpu(reader, batch_size):
    """One epoch of the train workload over a reader (GPU decode), for ndd.compile."""
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        yield decode_rrc_cmn_gpu(jpegs), labels


def train_epoch_cpu(reader, batch_size):
    """One epoch of the train workload over a reader (CPU decode), for ndd.compile."""
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        yield decode_rrc_cmn_cpu(jpegs), labels


def eager_epoch(reader, batch_size: int, device: str, capture: bool) -> Iterator:
    """One epoch of the train workload in eager dynamic mode (or DALI capture mode)."""
    decode = decode_rrc_cmn_gpu if device == "gpu" else decode_rrc_cmn_cpu
    for jpegs, labels in reader.next_epoch(batch_size=batch_size, capture=capture):
        yield decode(jpegs), labels


def build_train_pipeline(options, file_list: Path, rank: int, world: int, device_id):
    """The hand-written pipeline of the train workload, on this rank's shard."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def train_pipeline():
        jpegs, labels = fn.readers.file(
            file_root=str(file_list.parent), file_list=str(file_list), shard_id=rank,
            num_shards=world, random_shuffle=True, seed=options.seed, pad_last_batch=True,
            name="Reader")
        images = fn.decoders.image(jpegs, device="mixed" if options.device == "gpu" else "cpu")
        images = fn.random_resized_crop(images, size=[224, 224])
        images = fn.crop_mirror_normalize(
            images,
            mirror=fn.random.coin_flip(probability=0.5),
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[123.675, 116.28, 103.53],
            std=[58.395, 57.12, 57.375],
        )
        return images, labels

    pipe = train_pipeline(batch_size=options.batch_size, num_threads=options.threads,
                          device_id=device_id, seed=options.seed + 1000 + rank,
                          prefetch_queue_depth=2)
    pipe.build()
    return pipe


def pipeline_output_to_torch(output):
    """A pipeline output (TensorList) as a torch tensor, without a copy where DALI allows."""
    import numpy as np
    import torch
    from nvidia.dali.tensors import TensorListGPU

    tensor = output.as_tensor()
    if isinstance(output, TensorListGPU):
        return torch.from_dlpack(tensor)
    return torch.from_numpy(np.asarray(tensor))  # pinned memory is no DLPack device for torch


def mode_epochs(mode: str, options, file_list: Path, rank: int, world: int,
                device_id) -> Callable[[int], Iterator]:
    """Return epoch_index -> an iterator of (images, labels) torch tensors for `mode`."""
    batch_size, device = options.batch_size, options.device
    if mode == "pipeline":
        pipe = build_train_pipeline(options, file_list, rank, world, device_id)
        padded = pipe.reader_meta("Reader")["epoch_size_padded"]

        def pipeline_epoch(epoch: int) -> Iterator:
            shard = (rank + epoch) % world  # stick_to_shard=False: the shard moves on each epoch
            shard_size = padded * (shard + 1) // world - padded * shard // world
            for _ in range(math.ceil(shard_size / batch_size)):
                images, labels = pipe.run()
                yield pipeline_output_to_torch(images), pipeline_output_to_torch(labels)

        return pipeline_epoch

    reader = ndd.readers.File(file_root=str(file_list.parent), file_list=str(file_list),
                              shard_id=rank, num_shards=world, random_shuffle=True,
                              seed=options.seed, pad_last_batch=True)
    if mode in COMPILED_MODES:
        generator = train_epoch_gpu if device == "gpu" else train_epoch_cpu
        extra = {"optimize": True} if mode == "optimize" else {}
        if device_id is not None:
            extra["device_id"] = device_id  # as examples/ddp_train.py does
        loader = ndd.compile(generator, **extra)

        def batches(epoch: int) -> Iterator:
            return loader(reader, batch_size)
    else:  # eager, transparent (the same code, NDD_TRACE=1) and capture

        def batches(epoch: int) -> Iterator:
            return eager_epoch(reader, batch_size, device, mode == "capture")

    def dynamic_epoch(epoch: int) -> Iterator:
        for images, labels in batches(epoch):
            yield images.torch(), labels.torch()

    return dynamic_epoch


def check_mode_switch(mode: str) -> dict:
    """Check that transparent mode is on exactly in the `transparent` worker; describe it."""
    ndd_trace = sys.modules.get("ndd_trace")
    enabled = bool(ndd_trace is not None and ndd_trace.is_enabled())
    if mode == "transparent" and not enabled:
        raise RuntimeError("NDD_TRACE=1 did not switch transparent mode on in this rank")
    if mode != "transparent" and enabled:
        raise RuntimeError(f"transparent mode is on in the {mode!r} worker (NDD_TRACE set?)")
    return {"transparent": enabled, "hook": HOOK_SOURCE if enabled else None,
            "ndd_trace_file": getattr(ndd_trace, "__file__", None)}


def run_worker(mode: str, options) -> int:
    """Run `mode` in this rank: epochs of the train workload, timed, with the shard check."""
    import torch
    import torch.distributed as dist

    if mode in COMPILED_MODES:
        if str(REPO_ROOT) not in sys.path:
            sys.path.append(str(REPO_ROOT))
        import ndd_trace  # noqa: F401 (installs ndd.compile)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    Path(options.result_dir, f"rank{rank}.pid").write_text(str(os.getpid()))  # for stop_job
    gpu = options.device == "gpu"
    if gpu:
        torch.cuda.set_device(local_rank)  # DALI's current device follows
    dist.init_process_group("nccl" if gpu else "gloo")
    result: dict = {"rank": rank, "world": world, "local_rank": local_rank, "mode": mode,
                    "status": "ok", "epochs": []}

    def barrier():
        """All ranks here (on the GPU: on this rank's device, which NCCL cannot guess)."""
        if gpu:
            dist.barrier(device_ids=[local_rank])
        else:
            dist.barrier()

    try:
        result.update(check_mode_switch(mode))
        if rank == 0:
            prepare_data(options.data_dir, options.images, options.seed)
        barrier()
        file_list, dataset_size = prepare_data(options.data_dir, options.images, options.seed)
        ndd.set_num_threads(options.threads)
        ndd.random.set_seed(options.seed + 1000 + rank)
        device_id = local_rank if gpu else None
        epochs = mode_epochs(mode, options, file_list, rank, world, device_id)
        result["dataset_size"] = dataset_size
        for epoch in range(options.epochs):
            barrier()
            seen = []
            steps, shape = 0, None
            started = time.perf_counter()
            for images, labels in epochs(epoch):
                shape = images.shape
                if gpu:
                    torch.cuda.synchronize()  # the device: DALI's stream and torch's
                seen.append(labels.reshape(-1).clone())  # the label buffer is reused
                steps += 1
            seconds = time.perf_counter() - started
            labels_seen = torch.cat(seen).tolist() if seen else []
            gathered: list = [None] * world
            dist.all_gather_object(gathered, labels_seen)
            record = {"epoch": epoch, "timed": epoch >= options.warmup_epochs, "steps": steps,
                      "images": steps * options.batch_size, "seconds": seconds,
                      "label_set_digest": digest(sorted(set(labels_seen))),
                      "label_order_digest": digest(labels_seen),
                      "image_shape": list(shape) if shape is not None else None}
            if rank == 0:
                record["shard_check"] = check_shards(gathered, dataset_size, options.batch_size)
            result["epochs"].append(record)
    except Exception as error:  # noqa: BLE001 (any failure goes to the launcher's table)
        import traceback

        result.update(status="failed", error=f"{type(error).__name__}: {error}",
                      traceback=traceback.format_exc()[-4000:])
    Path(options.result_dir, RESULT_FILE.format(rank=rank)).write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0 if result["status"] == "ok" else 1


# --------------------------------------------------------------------------------------------
# Launcher: every (N, mode) in its own torchrun job, one table.
# --------------------------------------------------------------------------------------------


def compile_takes_optimize() -> bool:
    """Whether this checkout's ndd_trace.compile has an `optimize` argument."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        import ndd_trace
    except ImportError:
        return False
    return "optimize" in inspect.signature(ndd_trace.compile).parameters


def available_gpus() -> int:
    """How many CUDA devices torch sees here (0 without CUDA)."""
    try:
        import torch

        return torch.cuda.device_count()
    except (ImportError, RuntimeError):
        return 0


def child_environment(mode: str) -> dict:
    """The environment of a torchrun job: this checkout first on PYTHONPATH; NDD_TRACE=1 in the
    transparent job only (a user's NDD_TRACE would turn every mode transparent)."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("NDD_TRACE", "NDD_TRACE_REPORT")}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    environment.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets, without its warning
    if mode == "transparent":
        environment["NDD_TRACE"] = "1"
    return environment


def worker_arguments(mode: str, options, result_dir: str) -> list[str]:
    """The worker's command-line arguments."""
    return ["--worker", mode, "--device", options.device, "--epochs", str(options.epochs),
            "--warmup-epochs", str(options.warmup_epochs),
            "--batch-size", str(options.batch_size), "--threads", str(options.threads),
            "--seed", str(options.seed), "--images", str(options.images),
            "--data-dir", options.data_dir, "--result-dir", result_dir]


def summarize(ranks: list[dict], batch_size: int) -> dict:
    """Aggregate the ranks' results of one job: total img/s over the timed epochs, the check."""
    epoch_count = min(len(rank["epochs"]) for rank in ranks)
    timed = [epoch for epoch in range(epoch_count) if ranks[0]["epochs"][epoch]["timed"]]
    images = sum(rank["epochs"][epoch]["images"] for rank in ranks for epoch in timed)
    seconds = sum(max(rank["epochs"][epoch]["seconds"] for rank in ranks) for epoch in timed)
    checks = [ranks[0]["epochs"][epoch].get("shard_check") for epoch in range(epoch_count)]
    problems = [f"epoch {epoch}: {problem}" for epoch, check in enumerate(checks)
                for problem in (check or {"problems": ["no check"]})["problems"]]
    steps = [rank["epochs"][epoch]["steps"] for rank in ranks for epoch in timed]
    return {"images_per_s": images / seconds if seconds else None, "timed_images": images,
            "timed_seconds": seconds, "timed_epochs": len(timed),
            "steps_per_epoch": max(steps) if steps else 0,
            "shard_check_ok": bool(checks) and not problems, "shard_problems": problems,
            "per_rank_images_per_s": [
                sum(rank["epochs"][e]["images"] for e in timed)
                / sum(rank["epochs"][e]["seconds"] for e in timed) for rank in ranks]
            if timed else [],
            "label_order_digests": [[e["label_order_digest"] for e in rank["epochs"]]
                                    for rank in ranks]}


def stop_job(process: subprocess.Popen, result_dir: str) -> None:
    """Stop a torchrun job that ran out of time: SIGTERM to torchrun (it stops its ranks), then
    SIGKILL to torchrun and to each rank by the pid it wrote (torchrun starts every rank in a
    session of its own, which outlives a killed torchrun)."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pid_file in Path(result_dir).glob("rank*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass  # gone already


def run_job(gpus: int, mode: str, options) -> dict:
    """Run one torchrun job of `gpus` processes in `mode`; return its ranks' results."""
    job = {"gpus": gpus, "mode": mode, "status": "ok"}
    with tempfile.TemporaryDirectory(prefix="bench_ddp_") as result_dir:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={gpus}", str(Path(__file__).resolve()),
                   *worker_arguments(mode, options, result_dir)]
        job["command"] = " ".join(command)
        started = time.perf_counter()
        stderr_path = Path(result_dir, "stderr.txt")
        with open(stderr_path, "w") as stderr_file:  # a file, not a pipe a stray rank could hold
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr_file,
                                       cwd=REPO_ROOT, env=child_environment(mode))
            try:
                returncode = process.wait(timeout=options.timeout)
            except subprocess.TimeoutExpired:
                returncode = f"timed out after {options.timeout:g} s"
                stop_job(process, result_dir)
        stderr = stderr_path.read_text(errors="replace")
        job["wall_s"] = time.perf_counter() - started
        ranks = []
        for rank in range(gpus):
            path = Path(result_dir, RESULT_FILE.format(rank=rank))
            if path.exists():
                ranks.append(json.loads(path.read_text()))
    job["ranks"] = ranks
    failed = [rank for rank in ranks if rank["status"] != "ok"]
    if len(ranks) < gpus or failed or returncode != 0:
        job["status"] = "failed"
        if failed:
            job["error"] = f"rank {failed[0]['rank']}: {failed[0]['error']}"
        else:
            tail = [line for line in (stderr or "").strip().splitlines() if line.strip()]
            status = returncode if isinstance(returncode, str) else f"exit status {returncode}"
            job["error"] = (f"{status}, {len(ranks)} of {gpus} results; "
                            f"{tail[-1] if tail else ''}")
        job["stderr_tail"] = (stderr or "")[-4000:]
        if options.verbose:
            print(job["stderr_tail"], file=sys.stderr)
        return job
    job.update(summarize(ranks, options.batch_size))
    job["transparent_hook"] = ranks[0].get("hook")
    return job


def ratio(value: float | None, base: float | None) -> str:
    """value / base as '1.23x', or '-' where either is missing."""
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def print_table(jobs: list[dict], options) -> None:
    """Print N, mode, total img/s, scaling against N = 1, ratio to the pipeline and the check."""
    rate = {(job["gpus"], job["mode"]): job.get("images_per_s") for job in jobs
            if job["status"] == "ok"}
    unit = "GPU" if options.device == "gpu" else "CPU process"
    print(f"\ntrain workload, batch {options.batch_size} per {unit}, {options.images} images, "
          f"{options.epochs} epochs ({options.warmup_epochs} warm-up), "
          f"{options.threads} threads per rank, device {options.device}")
    header = (f"{'N':>2} {'mode':<12} {'img/s':>10} {'img/s/rank':>11} {'vs N=1':>8} "
              f"{'vs pipeline':>12} {'steps/ep':>9}  shard check")
    print(header)
    print("-" * len(header))
    for job in jobs:
        gpus, mode = job["gpus"], job["mode"]
        if job["status"] != "ok":
            print(f"{gpus:>2} {mode:<12} {job['status']}: {job.get('error', '')}")
            continue
        value = job["images_per_s"]
        check = "ok" if job["shard_check_ok"] else "FAIL: " + "; ".join(job["shard_problems"][:3])
        print(f"{gpus:>2} {mode:<12} {value:>10.1f} {value / gpus:>11.1f} "
              f"{ratio(value, rate.get((1, mode))):>8} "
              f"{ratio(value, rate.get((gpus, 'pipeline'))):>12} "
              f"{job['steps_per_epoch']:>9}  {check}")
    hooks = {job.get("transparent_hook") for job in jobs if job["mode"] == "transparent"} - {None}
    if hooks:
        print(f"transparent: NDD_TRACE=1, switched on by {', '.join(sorted(hooks))}")
    for gpus in dict.fromkeys(job["gpus"] for job in jobs):
        orders = {job["mode"]: job["label_order_digests"] for job in jobs
                  if job["gpus"] == gpus and job["status"] == "ok"}
        if len(orders) > 1:
            groups = collections.defaultdict(list)
            for mode, order in orders.items():
                groups[json.dumps(order)].append(mode)
            print(f"N={gpus}: sample order per rank and epoch "
                  + ("the same in every mode" if len(groups) == 1 else
                     "differs: " + " | ".join(", ".join(modes) for modes in groups.values())))
    if options.device == "gpu":
        for mode in ("compiled", "optimize"):
            for gpus, goal in SCALING_GOALS.items():
                base, value = rate.get((1, mode)), rate.get((gpus, mode))
                pipeline_base, pipeline = rate.get((1, "pipeline")), rate.get((gpus, "pipeline"))
                if base and value:
                    pipeline_scaling = (f", pipeline {pipeline / pipeline_base:.2f}x"
                                        if pipeline_base and pipeline else "")
                    verdict = "met" if value / base >= goal else "NOT met"
                    print(f"goal {mode} on {gpus} GPUs >= {goal}x: {value / base:.2f}x "
                          f"({verdict}{pipeline_scaling})")


def parse_list(text: str, choices: tuple[str, ...] | None, what: str) -> list[str]:
    """A comma-separated list, every item checked against `choices`."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if choices is not None and item not in choices]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(choices)})")
    return items


def parse_gpu_counts(text: str) -> list[int]:
    """--gpus: a comma-separated list of positive process counts."""
    try:
        counts = [int(item) for item in parse_list(text, None, "GPU count")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus takes integers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--gpus takes positive integers, got {text!r}")
    return counts


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the launcher and of the worker."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--gpus", type=parse_gpu_counts, default=[1, 2, 4, 8],
                        help="process counts N (capped at the GPUs present with --device gpu)")
    parser.add_argument("--modes", default=None,
                        type=lambda text: parse_list(text, MODES, "mode"),
                        help=f"comma-separated, of {', '.join(MODES)} (default: "
                             f"{','.join(DEFAULT_MODES)}, and optimize where compile takes it)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="gpu: one GPU per rank over NCCL; cpu: CPU processes over gloo")
    parser.add_argument("--batch-size", type=int, default=256, help="per rank")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per job, warm-up included")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="untimed epochs first")
    parser.add_argument("--images", type=int, default=32768, help="JPEG files in the data set")
    parser.add_argument("--threads", type=int, default=16, help="DALI CPU threads per rank")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data-dir", default=None,
                        help="JPEG directory (default: a cached one under the temp dir)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per torchrun job")
    parser.add_argument("--json", dest="json_path", default=None, help="write everything here")
    parser.add_argument("--verbose", action="store_true", help="print failed jobs' stderr")
    parser.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                        help="run nothing: print one table from the --json files of earlier "
                             "runs (e.g. one run per N where a command's time is limited)")
    parser.add_argument("--worker", choices=MODES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result-dir", default=None, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.warmup_epochs < 1 or options.epochs <= options.warmup_epochs:
        parser.error("--warmup-epochs must be at least 1 and --epochs more than that")
    if options.batch_size < 1 or options.images < 1 or options.threads < 1:
        parser.error("--batch-size, --images and --threads must be positive")
    if options.data_dir is None:
        options.data_dir = default_data_dir(options.images, options.seed)
    return options


def merge_reports(paths: list[str]) -> int:
    """Print one table from the --json reports of earlier runs (the first one's settings)."""
    reports = [json.loads(Path(path).read_text()) for path in paths]
    settings = argparse.Namespace(**reports[0]["config"])
    keys = ("device", "batch_size", "images", "epochs", "warmup_epochs", "threads", "seed")
    for path, report in zip(paths[1:], reports[1:], strict=True):
        differing = [key for key in keys if report["config"][key] != reports[0]["config"][key]]
        if differing:
            sys.exit(f"bench_ddp --merge: {path} differs from {paths[0]} in {differing}")
    jobs = sorted((job for report in reports for job in report["jobs"]),
                  key=lambda job: (job["gpus"], MODES.index(job["mode"])))
    print_table(jobs, settings)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The launcher (every N and mode, one table) or, with --worker, one rank of one job."""
    options = parse_arguments(argv)
    if options.worker:
        return run_worker(options.worker, options)
    if options.merge:
        return merge_reports(options.merge)

    wants_optimize = options.modes is None or "optimize" in options.modes
    has_optimize = wants_optimize and compile_takes_optimize()
    modes = options.modes or [*DEFAULT_MODES, *(["optimize"] if has_optimize else [])]
    gpu_counts = options.gpus
    notes = []
    if options.device == "gpu":
        present = available_gpus()
        if present == 0:
            sys.exit("bench_ddp: --device gpu needs CUDA GPUs (torch sees none); "
                     "use --device cpu here")
        skipped = [count for count in gpu_counts if count > present]
        gpu_counts = [count for count in gpu_counts if count <= present]
        if skipped:
            notes.append(f"skipped N={','.join(map(str, skipped))}: {present} GPU(s) present")
    print(f"preparing {options.images} JPEGs in {options.data_dir} ...", file=sys.stderr,
          flush=True)
    prepare_data(options.data_dir, options.images, options.seed)

    jobs = []
    for gpus in gpu_counts:
        for mode in modes:
            print(f"running N={gpus} {mode} ...", file=sys.stderr, flush=True)
            if mode == "optimize" and not has_optimize:
                jobs.append({"gpus": gpus, "mode": mode, "status": "unavailable",
                             "error": "ndd_trace.compile has no `optimize` argument"})
                continue
            jobs.append(run_job(gpus, mode, options))
    print_table(jobs, options)
    for note in notes:
        print(note)
    if options.json_path:
        from nvidia.dali import __version__ as dali_version

        machine = {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                   "python": platform.python_version(), "dali": dali_version}
        if options.device == "gpu":
            import torch

            machine["gpus"] = [torch.cuda.get_device_name(index)
                               for index in range(torch.cuda.device_count())]
        report = {"config": {key: value for key, value in vars(options).items()
                             if key not in ("worker", "result_dir")},
                  "modes": modes, "compile_takes_optimize": has_optimize, "notes": notes,
                  "machine": machine, "jobs": jobs}
        Path(options.json_path).write_text(json.dumps(report, indent=2))
        print(f"\nraw results written to {options.json_path}")
    return 0 if all(job["status"] in ("ok", "unavailable") and job.get("shard_check_ok", True)
                    for job in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
