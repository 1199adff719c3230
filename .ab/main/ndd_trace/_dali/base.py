"""The DALI objects every part of the adapter names: its version, Batch, Tensor, RNG, dtypes,
devices, eval modes.
"""

from __future__ import annotations

import functools

import nvidia.dali as dali
import nvidia.dali.experimental.dynamic as ndd
from nvidia.dali.experimental.dynamic import random as ndd_random


DALI_VERSION = dali.__version__
Batch = ndd.Batch
Tensor = ndd.Tensor
RNG = ndd_random.RNG
DType = ndd.DType
Device = ndd.Device
EvalMode = ndd.EvalMode
STATE_WORDS = ndd_random._STATE_WORDS


@functools.lru_cache(maxsize=64)
def device(kind: str, device_id: int | None) -> Device:
    """An ndd Device (shared: ndd never changes one)."""
    return Device(kind, device_id)


def batch_of(samples: list) -> Batch:
    """`ndd.batch(samples)`: samples (arrays, Tensors) gathered into a Batch, as eager does."""
    return ndd.batch(samples)


def install_compile(compile_function: object) -> None:
    """`ndd.compile`: ndd_trace's compile, reachable as `@ndd.compile` once ndd_trace is imported."""
    ndd.compile = compile_function


def dynamic_module() -> object:
    """DALI's dynamic-mode module itself (`from ndd_trace import ndd` is this module object)."""
    return ndd
