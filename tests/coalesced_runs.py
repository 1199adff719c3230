"""Run by test_coalescing.py in a child Python with NDD_TRACE_COALESCE set (read at import):
reader loops whose steps are launched ahead K at a time, compared with eager ndd exactly, in
every way the speculator serves (a compiled step in an eager loop, a compiled generator,
transparent mode). Prints one line per scenario: its name and the calls served coalesced."""

import sys

import numpy as np
from harness import Fresh, Step, assert_matches_eager

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.ahead.coalescing import SliceRun
from reader_steps import augment, file_reader


def epochs(reader, step, count=3, batch_size=3):
    out = []
    for _ in range(count):
        for jpegs, labels in reader.next_epoch(batch_size=batch_size):
            out.append((np.asarray(step(jpegs).torch()), np.asarray(labels.torch())))
    return out


def epochs_skipping_errors(reader, step):
    out = []
    for _ in range(3):
        for jpegs, labels in reader.next_epoch(batch_size=3):
            try:
                out.append((np.asarray(step(jpegs).torch()), np.asarray(labels.torch())))
            except RuntimeError as error:  # (a corrupt file's batch: eager's error, at its step)
                out.append(("error", str(error).splitlines()[0]))
    return out


def generator(reader, batch_size=3):
    for _ in range(3):
        for jpegs, labels in reader.next_epoch(batch_size=batch_size):
            yield augment(jpegs), labels


SERVED = []
_result = SliceRun.result
_run_alone = SliceRun._run_alone
ALONE = []


def _counting_alone(self):
    ALONE.append(self)
    return _run_alone(self)


SliceRun._run_alone = _counting_alone


def _counting(self, index=None):
    SERVED.append(self)
    return _result(self, index)


SliceRun.result = _counting


def main(root, corrupt_root):
    for name, call in [
        ("step", lambda: assert_matches_eager(epochs, Fresh(lambda: file_reader(root)),
                                              Step(augment), modes=("step",))),
        ("transparent", lambda: assert_matches_eager(epochs, Fresh(lambda: file_reader(root)),
                                                     Step(augment), modes=("transparent",))),
        ("generator", lambda: assert_matches_eager(generator, Fresh(lambda: file_reader(root)),
                                                   modes=("loop",))),
        ("step, a corrupt file", lambda: assert_matches_eager(
            epochs_skipping_errors, Fresh(lambda: file_reader(corrupt_root)), Step(augment),
            modes=("step", "transparent"))),
    ]:
        SERVED.clear()
        ALONE.clear()
        call()
        print(name, len(SERVED), len(ALONE), flush=True)
    batch = ndd.as_batch([np.zeros((8, 8, 3), np.uint8)] * 3, layout="HWC")
    said = [str(ndd_trace.explain(body, batch)).split("coalescing: ")[1].splitlines()[0]
            for body in (lambda x: ndd.flip(x, horizontal=1),
                         lambda x: ndd.pad(x, axis_names="HW"))]
    print("explain:", " | ".join(said), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
