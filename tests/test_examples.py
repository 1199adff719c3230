"""The examples run as documented (on the CPU here; on the GPU machine with --device gpu)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import HAS_GPU, ROOT

DEVICE = "gpu" if HAS_GPU else "cpu"


def test_main_example():
    completed = subprocess.run([sys.executable, "examples/preprocess.py", "--device", DEVICE],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert "compiled == eager, bit for bit" in completed.stdout


@pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "torchrun")), reason="needs torchrun")
def test_ddp_example_two_processes():
    import torch

    device = "gpu" if HAS_GPU and torch.cuda.device_count() >= 2 else "cpu"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    completed = subprocess.run(
        [torchrun if os.path.exists(torchrun) else "torchrun", "--nproc_per_node=2",
         "examples/ddp_train.py", "--device", device, "--epochs", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.count("distinct of 32") == 2
