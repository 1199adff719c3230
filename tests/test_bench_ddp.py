"""benchmarks/bench_ddp.py: the shard check on real sharded readers, and the launcher end to end
(2 CPU processes over gloo under torchrun, tiny data, the compiled, transparent and pipeline
modes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, subprocess_env

import nvidia.dali.experimental.dynamic as ndd

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_ddp  # noqa: E402


def _sharded_epochs(file_list, world: int, batch_size: int, epochs: int) -> list[list[list]]:
    """Every epoch's labels of every shard, read with the File reader as the ranks read them."""
    readers = [ndd.readers.File(file_root=str(file_list.parent), file_list=str(file_list),
                                shard_id=rank, num_shards=world, random_shuffle=True, seed=5,
                                pad_last_batch=True) for rank in range(world)]
    return [[[label for _, labels in reader.next_epoch(batch_size=batch_size)
              for label in labels.torch().reshape(-1).tolist()] for reader in readers]
            for _ in range(epochs)]


@pytest.mark.parametrize("images, world, batch_size", [(13, 3, 4), (16, 2, 3), (12, 4, 3)])
def test_shard_check_passes_on_dali_sharded_readers(tmp_path, images, world, batch_size):
    file_list, size = bench_ddp.prepare_data(str(tmp_path / "jpegs"), images, seed=0)
    assert size == images
    for epoch in _sharded_epochs(file_list, world, batch_size, epochs=2):
        check = bench_ddp.check_shards(epoch, size, batch_size)
        assert check["ok"], check["problems"]
        assert sorted(check["distinct_per_rank"]) == sorted(bench_ddp.shard_sizes(size, world))


def test_shard_check_finds_what_is_wrong():
    batch = 4
    good = [[0, 1, 2, 3, 4, 5, 5, 5], [6, 7, 8, 9, 10, 11, 11, 11]]  # 12 files, 2 shards of 6
    assert bench_ddp.check_shards(good, 12, batch)["ok"]

    def problems(per_rank):
        return " | ".join(bench_ddp.check_shards(per_rank, 12, batch)["problems"])

    assert "read by more than one rank" in problems(
        [[0, 1, 2, 3, 4, 5, 6, 6], [6, 7, 8, 9, 10, 11, 11, 11]])
    assert "1 of 12 files read by no rank" in problems(
        [[0, 1, 2, 3, 4, 4, 4, 4], [6, 7, 8, 9, 10, 11, 11, 11]])
    assert "different files repeated" in problems(
        [[0, 1, 2, 3, 4, 5, 5, 0], [6, 7, 8, 9, 10, 11, 11, 11]])
    assert "unequal steps" in problems([[0, 1, 2, 3, 4, 5, 5, 5], [6, 7, 8, 9, 10, 11, 11, 11,
                                                                   11, 11, 11, 11]])
    assert "not in the data set" in problems(
        [[0, 1, 2, 3, 4, 5, 5, 99], [6, 7, 8, 9, 10, 11, 11, 11]])


def test_launcher_on_two_cpu_processes(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    modes = ["compiled", "transparent", "pipeline"]
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "bench_ddp.py"),
               "--device", "cpu", "--gpus", "2", "--modes", ",".join(modes), "--images", "24",
               "--batch-size", "4", "--threads", "1", "--epochs", "2",
               "--data-dir", str(tmp_path / "jpegs"), "--json", str(report_path), "--verbose"]
    completed = subprocess.run(command, check=False, capture_output=True, text=True,
                               timeout=600, cwd=tmp_path, env=subprocess_env())
    assert completed.returncode == 0, completed.stdout + completed.stderr[-4000:]
    table = completed.stdout
    assert "img/s" in table and "vs pipeline" in table and "shard check" in table, table
    for mode in modes:
        assert any(line.split()[:2] == ["2", mode] and line.rstrip().endswith("ok")
                   for line in table.splitlines()), table
    report = json.loads(report_path.read_text())
    assert [job["mode"] for job in report["jobs"]] == modes
    for job in report["jobs"]:
        assert job["status"] == "ok" and job["shard_check_ok"], job
        assert len(job["ranks"]) == 2 and job["images_per_s"] > 0
        # each rank's shard, every epoch: 12 files of 24, 3 steps of 4
        for rank in job["ranks"]:
            assert [epoch["steps"] for epoch in rank["epochs"]] == [3, 3]
            assert rank["transparent"] == (job["mode"] == "transparent"), rank
            assert rank["ndd_trace_file"] is None or rank["ndd_trace_file"].startswith(ROOT)
        checks = [epoch["shard_check"] for epoch in job["ranks"][0]["epochs"]]
        assert [check["distinct_per_rank"] for check in checks] == [[12, 12], [12, 12]]


    # --merge prints the same table from the JSON report
    assert bench_ddp.main(["--merge", str(report_path)]) == 0
    merged = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line[:2].strip().isdigit()]
    assert rows and all(row in merged for row in rows), merged
