"""PyTorch Lightning over a compiled loop (examples/lightning_train.py): `Trainer.fit` on the
CPU, checkpointed and stopped mid-epoch (or at an epoch's end), resumed in a new process with
the same batches, losses and final weights as the uninterrupted run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, subprocess_env

pytest.importorskip("pytorch_lightning")
pytest.importorskip("torchdata")


def _example(*args: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, "examples/lightning_train.py", "--steps", "10", *args], cwd=ROOT,
        capture_output=True, text=True, timeout=600, env=subprocess_env())
    assert completed.returncode == 0, completed.stderr[-3000:]
    return [line for line in completed.stdout.splitlines()
            if line.startswith(("step ", "weights "))]


@pytest.fixture(scope="module")
def full() -> list[str]:
    """The uninterrupted run: 10 steps, epochs of 4 batches."""
    lines = _example()
    assert len(lines) == 11 and lines[-1].startswith("weights ")
    assert [line.split()[3] for line in lines[:10]] == ["0"] * 4 + ["1"] * 4 + ["2"] * 2
    return lines


@pytest.mark.parametrize("save_at", [6, 4])  # mid-epoch, an epoch's end
def test_fit_resumes_mid_epoch_with_the_same_batches(full, tmp_path, save_at):
    checkpoint = str(tmp_path / "run.ckpt")
    saved = _example("--save-at", str(save_at), "--checkpoint", checkpoint)
    assert saved[:save_at] == full[:save_at]
    resumed = _example("--resume", checkpoint)
    assert resumed == full[save_at:]  # steps, epochs, batches, losses and the final weights
