"""Can K calls of a random op be coalesced into one pipeline run of batch K x N, bit for bit?

ndd draws one 7-word Philox state per op call and feeds it as the op's `_random_state`
argument, one copy per sample. This probe feeds a batch of 2 x N samples whose first N carry
call A's state and whose last N carry call B's, and compares each half with the run of its own
call (batch N). It prints, per op, whether each half matches:

    PYTHONPATH=. python benchmarks/probe_random_state.py
    # uniform: call A True, call B False ... (DALI 2.4.0, 2026-12-04)

Call A's half matches and call B's does not, for inputless ops (uniform, coin_flip) and data
ops (random_resized_crop) alike: an op reads the state of the batch's first sample and derives
every sample's values from it and the sample's position. K calls' states cannot be fed to one
run, so a coalesced run cannot reproduce eager's random values; random ops must stay out of a
coalesced part (issue 34).
"""
import numpy as np
from nvidia.dali import fn, pipeline_def, types

N = 4


def _pipeline(batch_size):
    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def states_fed():
        state = fn.external_source(name="state", dtype=types.UINT32, ndim=1)
        images = fn.external_source(name="images", dtype=types.UINT8, ndim=3, layout="HWC")
        return (fn.random.uniform(range=[0, 1], _random_state=state),
                fn.random.coin_flip(_random_state=state),
                fn.random_resized_crop(images, size=[8, 8], _random_state=state))

    pipe = states_fed()
    pipe.build()
    return pipe


def _run(pipe, states, images):
    pipe.feed_input("state", states)
    pipe.feed_input("images", images)
    return [[np.array(output[i]) for i in range(len(states))] for output in pipe.run()]


def main():
    rng = np.random.default_rng(0)
    state_a, state_b = (rng.integers(0, 2**32, 7, dtype=np.uint32) for _ in range(2))
    images = [rng.integers(0, 255, (20 + 3 * i, 30 + i, 3), dtype=np.uint8) for i in range(2 * N)]
    small, large = _pipeline(N), _pipeline(2 * N)
    call_a = _run(small, [state_a] * N, images[:N])
    call_b = _run(small, [state_b] * N, images[N:])
    both = _run(large, [state_a] * N + [state_b] * N, images)
    for name, a, b, ab in zip(("uniform", "coin_flip", "random_resized_crop"), call_a, call_b,
                              both):
        same_a = all(np.array_equal(x, y) for x, y in zip(a, ab[:N]))
        same_b = all(np.array_equal(x, y) for x, y in zip(b, ab[N:]))
        print(f"{name}: call A {same_a}, call B {same_b}")


if __name__ == "__main__":
    main()
