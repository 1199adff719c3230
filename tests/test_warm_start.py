"""The warm start (NDD_TRACE_CACHE_DIR): a later process loads DALI's parse of the calling module
instead of parsing it again, and everything it computes is what the cold process computed."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from conftest import subprocess_env

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import nvidia.dali.experimental.dynamic as ndd
    import ndd_trace
    from ndd_trace._dali import analysis

    MEAN = [0.5, 0.25, 0.125]

    @ndd.compile
    def step(images, mean, seed_rng):
        # `mean` is a parameter: eager passes it as a per-call tensor argument (the call-site
        # analysis says so), a literal list as a construction argument
        images = ndd.crop_mirror_normalize(images, mean=mean, std=[2.0, 2.0, 2.0],
                                           dtype=ndd.float32, output_layout="HWC")
        flipped = ndd.flip(images, horizontal=ndd.random.coin_flip(
            batch_size=images.batch_size, rng=seed_rng))
        return ndd.resize(flipped, size=[4, 4])

    data = ndd.as_batch([np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3) + i
                         for i in range(3)], layout="HWC")
    outs = [np.asarray(step(data, MEAN, ndd.random.RNG(seed=7)).torch()) for _ in range(2)]
    eager = np.asarray(step.__wrapped__(data, MEAN, ndd.random.RNG(seed=7)).torch())
    print(json.dumps({
        "stats": analysis.stats,
        "same_as_eager": bool((outs[0] == eager).all() and (outs[1] == eager).all()),
        "code": ndd_trace.explain(step, data, MEAN, ndd.random.RNG(seed=7)).code,
        "cache": step.cache_info()._asdict(),
        "dir": ndd_trace.cache_dir(),
    }))
''')


def _run(script: str, cache: str | None, extra: str = "") -> dict:
    env = subprocess_env()
    env.pop("NDD_TRACE_CACHE_DIR", None)
    if cache is not None:
        env["NDD_TRACE_CACHE_DIR"] = cache
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train_step.py"
    path.write_text(SCRIPT)
    return str(path)


def _entries(cache: str) -> list[str]:
    return sorted(name for name in os.listdir(cache) if name.endswith(".pickle"))


def test_a_later_process_loads_the_parse_and_computes_the_same(script, tmp_path):
    cache = str(tmp_path / "cache")
    plain = _run(script, None)
    cold = _run(script, cache)
    warm = _run(script, cache)
    assert plain["stats"] == {"loaded": 0, "saved": 0, "failed": 0} and plain["dir"] is None
    assert cold["stats"]["saved"] == 1 and cold["stats"]["loaded"] == 0
    assert warm["stats"]["loaded"] == 1 and warm["stats"]["saved"] == 0
    assert warm["dir"] == os.path.abspath(cache)
    assert len(_entries(cache)) == 1
    for run in (plain, cold, warm):
        assert run["same_as_eager"]
        assert run["cache"]["traces"] == 1 and run["cache"]["hits"] == 1
    # what the trace decided from the parse (the split of `mean=` into a per-call tensor
    # argument, std= a construction one) is the cold process's, line for line
    assert warm["code"] == cold["code"] == plain["code"]
    assert "mean=" in plain["code"]


def test_an_edited_module_is_parsed_again(script, tmp_path):
    cache = str(tmp_path / "cache")
    _run(script, cache)
    with open(script, "a") as file:
        file.write("# edited\n")
    edited = _run(script, cache)
    assert edited["stats"]["saved"] == 1 and edited["stats"]["loaded"] == 0
    assert len(_entries(cache)) == 2


def test_a_corrupt_entry_is_made_again(script, tmp_path):
    cache = str(tmp_path / "cache")
    _run(script, cache)
    (entry,) = _entries(cache)
    with open(os.path.join(cache, entry), "wb") as file:
        file.write(b"not a pickle")
    again = _run(script, cache)
    assert again["same_as_eager"]
    assert again["stats"]["saved"] == 1 and again["stats"]["loaded"] == 0
    reloaded = _run(script, cache)
    assert reloaded["stats"]["loaded"] == 1


def test_an_unwritable_directory_loses_nothing(script, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory would be")
    run = _run(script, str(blocker / "cache"))
    assert run["same_as_eager"] and run["stats"] == {"loaded": 0, "saved": 0, "failed": 0}
    assert run["stderr"].count("cannot be used: Not a directory") == 1, run["stderr"]


def test_the_saved_parse_answers_as_a_fresh_one():
    """Every call site DALI can identify in a large module, and what it resolves about them
    (positions, parents, scopes of names), is the same after a round trip through the cache."""
    from nvidia.dali.experimental.dynamic import _source_analysis

    from ndd_trace._dali import analysis

    import training_programs

    code = training_programs.__loader__.get_code("training_programs")
    fresh = _source_analysis._get_module_info(code)
    import io

    buffer = io.BytesIO()
    analysis._Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(fresh)
    loaded = pickle.loads(buffer.getvalue())
    assert isinstance(loaded, _source_analysis.ModuleInfo)
    assert list(loaded.nodes_by_position) == list(fresh.nodes_by_position)
    for (span, node), (_, other) in zip(fresh.nodes_by_position.items(),
                                        loaded.nodes_by_position.items()):
        assert type(node) is type(other), span
        if node is not None:
            assert type(fresh.parent_of.get(node)) is type(loaded.parent_of.get(other))
    names = [(node, other) for node, other in zip(fresh.scope_of_node, loaded.scope_of_node)]
    assert len(names) == len(fresh.scope_of_node) == len(loaded.scope_of_node)
    import libcst as cst

    checked = 0
    for node, other in names:
        assert type(node) is type(other)
        if isinstance(node, cst.Name):
            first, second = fresh.binding(node), loaded.binding(other)
            assert (first is None) == (second is None)
            if first is not None:
                assert first.in_scope == second.in_scope
                assert type(first.rhs) is type(second.rhs)
            checked += 1
    assert checked > 100


TRANSPARENT = textwrap.dedent('''
    import json
    import numpy as np
    import nvidia.dali.experimental.dynamic as ndd
    from ndd_trace._dali import analysis

    def augment(images, mean):
        images = ndd.crop_mirror_normalize(images, mean=mean, std=[2.0, 2.0, 2.0],
                                           dtype=ndd.float32, output_layout="HWC")
        return ndd.resize(images, size=[4, 4]) * 0.5

    data = ndd.as_batch([np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3) + i
                         for i in range(3)], layout="HWC")
    out = [np.asarray(augment(data, [0.5, 0.25, 0.125]).torch()).tolist() for _ in range(3)]
    print(json.dumps({"stats": analysis.stats, "out": out}))
''')


def test_transparent_mode_starts_warm_too(tmp_path):
    """An unmodified script under `python -m ndd_trace`: the same values cold, warm and eager."""
    path = tmp_path / "plain_script.py"
    path.write_text(TRANSPARENT)
    cache = str(tmp_path / "cache")

    def run(*launcher: str, cache_dir: str | None) -> dict:
        env = subprocess_env()
        env.pop("NDD_TRACE_CACHE_DIR", None)
        if cache_dir is not None:
            env["NDD_TRACE_CACHE_DIR"] = cache_dir
        done = subprocess.run([sys.executable, *launcher, str(path)], capture_output=True,
                              text=True, env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    eager = run(cache_dir=None)
    cold = run("-m", "ndd_trace", cache_dir=cache)
    warm = run("-m", "ndd_trace", cache_dir=cache)
    # the script, and DALI's own module where its arithmetic calls come from (eager parses both)
    assert cold["stats"]["saved"] >= 1 and cold["stats"]["loaded"] == 0
    assert warm["stats"]["loaded"] == cold["stats"]["saved"] and warm["stats"]["saved"] == 0
    assert eager["out"] == cold["out"] == warm["out"]


def test_a_compiled_functions_module_is_parsed_before_its_first_call(tmp_path):
    """The parse DALI's call-site analysis needs is made on a thread of its own from the
    decoration on (the first call waits for it instead of making it); a launched script's from
    its start. Without a cache directory too, and what the first call computes is unchanged."""
    module = tmp_path / "parsed_ahead.py"
    module.write_text(textwrap.dedent('''
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace

        @ndd.compile
        def step(images):
            return ndd.flip(images, horizontal=1)
    '''))
    probe = textwrap.dedent(f'''
        import sys, json
        sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np
        from nvidia.dali.experimental.dynamic import _source_analysis
        from ndd_trace._dali import analysis
        import parsed_ahead
        analysis._parsing[parsed_ahead.__file__].join()
        held = parsed_ahead.__file__ in _source_analysis._file_cache
        data = parsed_ahead.ndd.as_batch([np.arange(12, dtype=np.uint8).reshape(2, 2, 3)])
        out = np.asarray(parsed_ahead.step(data).torch())
        eager = np.asarray(parsed_ahead.step.__wrapped__(data).torch())
        print(json.dumps([held, bool((out == eager).all())]))
    ''')
    env = subprocess_env()
    env.pop("NDD_TRACE_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [True, True]
