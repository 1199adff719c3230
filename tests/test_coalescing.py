"""Coalescing (issue 34): K consecutive calls of batch N run as one pipeline run of batch
K x N, with each call's values bit for bit eager's (codegen/coalesce.py), launched ahead K at a
time by the speculator under NDD_TRACE_COALESCE=K (ahead/coalescing.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import subprocess_env

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from benchmarks._data import jpeg_paths
from ndd_trace import _dali
from ndd_trace.codegen.coalesce import INDEX_PATH, CannotCoalesce, coalesce
from ndd_trace.core.ir import NodeKind
from ndd_trace.execution.building import Options
from ndd_trace.units.build import compile_graph

K, N = 3, 4


def _step(x):
    x = ndd.resize(ndd.flip(x, horizontal=1), size=[20, 20])
    x = ndd.pad(ndd.cast(x, dtype=ndd.float32), axis_names="HW", shape=[24, 24])
    mirror = ndd.random.coin_flip(batch_size=x.batch_size)
    crop = ndd.random_resized_crop(x, size=[16, 16])
    return ndd.crop_mirror_normalize(crop, mirror=mirror, output_layout="CHW",
                                     mean=[1.0, 2.0, 3.0], std=[2.0, 3.0, 4.0]), mirror


def _traced_graph(function, batch):
    compiled = ndd_trace.compile(function)
    compiled(batch)
    (entry,) = compiled._cache.units.values()
    return entry.graph


def _batches(seed=0):
    rng = np.random.default_rng(seed)
    return [ndd.as_batch([rng.integers(0, 256, (28, 30, 3), np.uint8) for _ in range(N)],
                         layout="HWC") for _ in range(K)]


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_k_calls_as_one_graph_give_each_calls_values_bit_for_bit(device):
    """The deterministic ops run over all K x N samples; each random op once per call on its
    call's slice, fed that call's state: the K calls' outputs are eager's, random ops included."""
    batches = _batches()
    if device == "gpu":
        batches = [batch.gpu() for batch in batches]
    coalesced = coalesce(_traced_graph(_step, batches[0]), K, N)
    assert coalesced.sliced_ops == 2 and len(coalesced.graph.outputs) == 2
    ndd.random.set_seed(5)
    eager = [_step(batch) for batch in batches]
    ndd.random.set_seed(5)
    rng = _dali.default_rng()
    states = [[_dali.draw_state(rng) for _ in coalesced.state_inputs] for _ in range(K)]
    bound = {}
    for node in coalesced.graph.nodes_of(NodeKind.INPUT):
        if node.payload == INDEX_PATH:
            bound[node.payload] = ndd.as_batch([np.array(i, np.int32) for i in range(K * N)])
        elif node in coalesced.state_inputs:
            number = coalesced.state_inputs.index(node)
            bound[node.payload] = ndd.as_batch([np.asarray(states[i // N][number], np.uint32)
                                                for i in range(K * N)])
        else:
            bound[node.payload] = ndd.as_batch([np.asarray(s) for b in batches for s in b.cpu()],
                                               layout="HWC", device=device)
    program = compile_graph(coalesced.graph, Options(
        num_threads=2, device_id=0 if device == "gpu" else None, prefetch_queue_depth=1))
    outputs = program.executable.run(bound, K * N).result()
    for call in range(K):
        for index in range(2):
            got = _dali.wrap_batch(_dali.sample_range(outputs[index], call * N, (call + 1) * N))
            assert got.batch_size == N and got._storage.is_dense_tensor() == \
                outputs[index].is_dense_tensor()  # (views: no copy made)
            for want, have in zip(ndd.as_batch(eager[call][index]).cpu(), got.cpu()):
                assert np.array_equal(np.asarray(want), np.asarray(have))


@pytest.mark.parametrize("body, named", [
    (lambda x: ndd.pad(x, axis_names="HW"), "ndd.pad"),
    (lambda x: ndd.normalize(ndd.cast(x, dtype=ndd.float32), batch=True), "ndd.normalize"),
    (lambda x: ndd.reductions.mean(x, axes=[0, 1]), "ndd.reductions.mean"),
], ids=["pad-to-the-batch", "batch-statistics", "not-known-per-sample"])
def test_an_op_that_may_read_the_whole_batch_is_not_coalesced_and_the_reason_names_it(body,
                                                                                     named):
    graph = _traced_graph(body, _batches()[0])
    with pytest.raises(CannotCoalesce) as caught:
        coalesce(graph, K, N)
    line = body.__code__.co_firstlineno  # (the user's call of the op)
    assert named in str(caught.value) and f"test_coalescing.py:{line}" in str(caught.value)


def test_reader_loops_launched_k_calls_at_a_time_match_eager_in_every_mode(jpeg_dir, tmp_path):
    """NDD_TRACE_COALESCE=4: a compiled step in an eager loop, a compiled generator and
    transparent mode serve their calls from coalesced runs, with eager's values, sample order,
    random values and errors (a corrupt file's batch fails at its own step, the others in its
    coalesced run give their values)."""
    corrupt = tmp_path / "photos"
    shutil.copytree(jpeg_dir, corrupt)
    victim = sorted(jpeg_paths(str(corrupt)))[5]
    Path(victim).write_bytes(Path(victim).read_bytes()[:1000])
    tests = Path(__file__).parent
    done = subprocess.run(
        [sys.executable, str(tests / "coalesced_runs.py"), str(jpeg_dir), str(corrupt)],
        env=subprocess_env(NDD_TRACE_COALESCE="4",
                           PYTHONPATH=f"{tests.parent}:{tests}"),
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    said = lines.pop()  # explain, of a step that is coalesced and of one that is not
    assert said.startswith("explain: 4 calls fed reader batches launched ahead as one run"), said
    assert "| not coalesced: ndd.pad (called at" in said and "reads the whole batch" in said
    served = {line.rsplit(" ", 2)[0]: tuple(map(int, line.rsplit(" ", 2)[1:])) for line in lines}
    assert set(served) == {"step", "transparent", "generator", "step, a corrupt file"}, served
    assert all(count > 0 for count, _ in served.values()), served
    # (calls run on their own after a coalesced run failed: only where a file is corrupt; an
    # epoch's short last batch is launched alone, not coalesced and failed)
    assert [alone for name, (_, alone) in served.items() if "corrupt" not in name] == [0] * 3
    assert served["step, a corrupt file"][1] > 0, served


def test_the_coalesced_twin_is_freed_with_its_original_and_built_again_when_launched():
    """A twin pipeline is not a second live pipeline outside the LRU: releasing the original
    (the least recently run, past the live limit) frees the twin too; it is built again at its
    next launch."""
    from ndd_trace.ahead.coalescing import Coalescer

    batches = _batches()
    compiled = ndd_trace.compile(_step)
    compiled(batches[0])
    (entry,) = compiled._cache.units.values()
    twin = Coalescer(entry.executable, 2, N)
    entry.executable.companions.append(twin)  # (as coalesced_twin keeps it)
    assert twin.executable.pipeline is not None
    entry.executable.release()
    assert twin.executable.pipeline is None
    calls = [[_dali.storage_of(batch) if node.kind is NodeKind.INPUT else
              _dali.broadcast_state(np.asarray(_dali.draw_state(_dali.default_rng()),
                                               np.uint32), N)
              for node in entry.executable.lowered.external_sources] for batch in batches[:2]]
    runs = twin.launch(calls, N)
    assert runs is not None and twin.executable.pipeline is not None
    assert [len(run.result()) for run in runs] == [2, 2]
