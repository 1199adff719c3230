"""The CUDA driver's set-up started at a trace (execution/warmup.py): only where it is what the
trace is about to make eager ndd do, never an error, and results unchanged."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from conftest import subprocess_env

import ndd_trace
from ndd_trace.execution import warmup


@pytest.fixture
def fresh(monkeypatch):
    """warmup as in a process that has not traced yet (restored afterwards)."""
    monkeypatch.setattr(warmup, "_state", "not started")
    monkeypatch.delenv(warmup.ENV_VAR, raising=False)
    yield
    _join()


def _join() -> None:
    for thread in threading.enumerate():
        if thread.name == "ndd_trace CUDA warm-up":
            thread.join(timeout=30)


def test_a_cpu_trace_sets_nothing_up(fresh):
    @ndd_trace.compile
    def step(images):
        return ndd.flip(images, horizontal=1)

    data = ndd.as_batch([np.arange(12, dtype=np.uint8).reshape(2, 2, 3)], layout="HWC")
    if ndd.EvalContext.current().device_id is not None:
        pytest.skip("ndd runs on a GPU here")
    out = np.asarray(step(data).torch())
    assert (out == np.asarray(step.__wrapped__(data).torch())).all()
    assert warmup.state() == "skipped: the trace runs on the CPU"


def test_transparent_mode_starts_it_at_the_first_call(fresh):
    data = ndd.as_batch([np.arange(12, dtype=np.uint8).reshape(2, 2, 3)], layout="HWC")
    with ndd_trace.enabled():
        assert warmup.state() == "not started"  # not at enable(): a script may fork first
        out = ndd.flip(data, horizontal=1)
        assert warmup.state() != "not started"
    assert np.asarray(out.torch()).shape == (1, 2, 2, 3)


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_the_environment_switches_it_off(fresh, monkeypatch, value):
    monkeypatch.setenv(warmup.ENV_VAR, value)
    warmup.start(0)
    assert warmup.state() == "off (NDD_TRACE_CUDA_WARMUP=0)"


def test_another_device_is_left_alone(fresh):
    warmup.start(1)
    assert warmup.state() == "skipped: the trace runs on GPU 1, not the only one"


def test_once_per_process(fresh):
    warmup.start(None)
    warmup.start(0)  # a later trace on a GPU: nothing more
    assert warmup.state() == "skipped: the trace runs on the CPU"


def test_no_driver_is_no_error(fresh, monkeypatch):
    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    warmup.start(0)
    _join()
    assert warmup.state() == "skipped: no CUDA driver (libcuda.so.1)"


class _Driver:
    """libcuda's calls as the warm-up makes them, answering as a machine of `devices` GPUs."""

    def __init__(self, devices: int, active: int = 0, init: int = 0):
        self.devices, self.active, self.init, self.calls = devices, active, init, []

    def cuInit(self, flags):
        self.calls.append("cuInit")
        return self.init

    def cuDeviceGetCount(self, count):
        self.calls.append("cuDeviceGetCount")
        count._obj.value = self.devices
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, device, flags, active):
        active._obj.value = self.active
        return 0

    def cuDevicePrimaryCtxRetain(self, context, device):
        self.calls.append("cuDevicePrimaryCtxRetain")
        return 0


@pytest.mark.parametrize("devices, active, init, retained, state", [
    (1, 0, 0, True, "done in"),
    (8, 0, 0, False, "skipped: 8 devices visible (set up only where one is)"),
    (1, 1, 0, False, "skipped: the device's context was already set up"),
    (0, 0, 100, False, "skipped: cuInit failed (no usable GPU)"),
])
def test_what_the_driver_says_decides(fresh, monkeypatch, devices, active, init, retained, state):
    """The driver's answers, not the machine's (the driver API's calls, answered here): a
    context only on the one device there is, and only where none is yet."""
    driver = _Driver(devices, active, init)
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *args, **kwargs: driver)
    warmup.start(0)
    _join()
    assert warmup.state().startswith(state)
    assert ("cuDevicePrimaryCtxRetain" in driver.calls) == retained


@pytest.mark.gpu
def test_on_a_gpu_the_context_is_ready_and_results_are_eager_s(tmp_path):
    """In a fresh process on the GPU machine: the trace sets the driver up, torch and the
    compiled step use the same primary context, and the values are eager's."""
    script = tmp_path / "gpu_warmup.py"
    script.write_text(textwrap.dedent('''
        import json, threading
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import torch
        import ndd_trace
        from ndd_trace.execution import warmup

        @ndd.compile
        def step(images):
            return ndd.crop_mirror_normalize(images.gpu(), dtype=ndd.float32, mirror=1)

        data = ndd.as_batch([np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)] * 2,
                            layout="HWC")
        out = step(data).torch()
        for thread in threading.enumerate():
            if thread.name == "ndd_trace CUDA warm-up":
                thread.join()
        eager = step.__wrapped__(data).torch()
        print(json.dumps({"state": warmup.state(), "same": bool(torch.equal(out, eager)),
                          "torch_after": float((out.cuda() * 2).sum())}))
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["same"]
    assert result["state"].startswith(("done in", "skipped: the device's context")), result
