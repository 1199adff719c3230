"""The CUDA driver's set-up, started in a thread when a trace begins: a head start for the build.

    warmup.start(device_id)        # at a trace's start: returns at once, the set-up runs aside
    warmup.state()                 # "off", "skipped: ...", "running", "done in 0.25 s", ...

A GPU pipeline's first build, or ndd's first op call, sets up the CUDA driver: `cuInit` and the
device's primary context, ~0.25 s on the H200 host, paid at the first batch. The driver's calls
let the GIL go (through ctypes, Python ran at full speed beside them: benchmarks/RESULTS.md,
eleventh session), so started when a trace begins, the set-up runs while the trace's own Python
runs (the call-site parse, the recording), and what comes next finds the context ready.

It does only what the trace is about to make eager ndd do: set up the one device ndd runs on.
It starts only where exactly one device is visible, that device is the trace's (0), and its
primary context is not active yet: a torchrun rank that sees every GPU never gets a context on
GPU 0 from ndd_trace, and a process whose context torch already made is left alone. It starts at
a trace, never at import: a process that forks before its first ndd call (and uses CUDA in the
children) forks before the driver is set up, as without ndd_trace. No libcuda (a CPU machine),
`NDD_TRACE_CUDA_WARMUP=0`, or any driver error: nothing is done, and the build sets the driver
up as it does without ndd_trace. Once per process.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

from ..core import logs

ENV_VAR = "NDD_TRACE_CUDA_WARMUP"

_lock = threading.Lock()
_state = "not started"


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a fork while a thread held it: the child's is free


os.register_at_fork(after_in_child=_after_fork)


def enabled() -> bool:
    """Whether NDD_TRACE_CUDA_WARMUP lets the set-up start (on unless it is 0, off, no, false)."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "off", "no", "false")


def state() -> str:
    """What the set-up did in this process, in words (for explain and the tests)."""
    return _state


def start(device_id: int | None) -> None:
    """Set the CUDA driver up for `device_id` in a daemon thread, where that is safe (see the
    module docstring); at most once per process, returning at once."""
    global _state
    if _state != "not started":  # (read without the lock: the common case, every trace after)
        return
    with _lock:
        if _state != "not started":
            return
        if not enabled():
            _state = f"off ({ENV_VAR}=0)"
            return
        if device_id != 0:
            _state = ("skipped: the trace runs on the CPU" if device_id is None
                      else f"skipped: the trace runs on GPU {device_id}, not the only one")
            return
        _state = "running"
    thread = threading.Thread(target=_set_up, name="ndd_trace CUDA warm-up", daemon=True)
    thread.start()


def _set_up() -> None:
    global _state
    started = time.perf_counter()
    try:
        outcome = _driver_set_up()
    except Exception as error:  # noqa: BLE001 (the build sets the driver up itself, as without)
        outcome = f"skipped: {type(error).__name__}: {error}"
    if outcome is None:
        outcome = f"done in {time.perf_counter() - started:.2f} s"
    _state = outcome
    logs.builds.info("CUDA warm-up: %s", outcome)


def _driver_set_up() -> str | None:
    """cuInit and device 0's primary context through the driver API; None when done, else why
    nothing was done."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "skipped: no CUDA driver (libcuda.so.1)"
    if cuda.cuInit(0) != 0:
        return "skipped: cuInit failed (no usable GPU)"
    count = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value != 1:
        return f"skipped: {count.value} devices visible (set up only where one is)"
    device = ctypes.c_int()
    if cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return "skipped: cuDeviceGet failed"
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) != 0:
        return "skipped: cuDevicePrimaryCtxGetState failed"
    if active.value:  # (torch, or another library, made it)
        return "skipped: the device's context was already set up"
    context = ctypes.c_void_p()
    # retained for the process's life, as the runtime's own retain of the primary context is
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
        return "skipped: cuDevicePrimaryCtxRetain failed"
    return None
