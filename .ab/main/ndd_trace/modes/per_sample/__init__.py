"""Per-sample functions: code written for one sample runs on a whole batch in one pipeline.

    @ndd.compile(per_sample=True)
    def augment(image):                              # written for one sample (a Tensor)
        if ndd.random.coin_flip(probability=0.3).item():
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]))
        if image.shape[0] > 512:                     # per-sample, data-dependent
            image = ndd.resize(image, resize_shorter=512)
        return image

    out = augment(batch)                             # a whole Batch, one pipeline run
    print(augment.converted_source)                  # the rewritten function

The function's AST is rewritten (printed with astunparse): the tests of `if`/`elif`/`while`,
the operands of `and`/`or`/`not` and conditional expressions go through `_ndd_condition`, which
turns a per-sample value into the predicate of DALI's conditional execution (Python values pass
through unchanged); `x.shape`, `x.item()` and friends go through `_ndd_attribute`. The
rewritten function then runs inside `@pipeline_def(enable_conditionals=True)` (DALI's AutoGraph),
its ndd calls becoming the same operators in pipeline mode, so each sample takes its own branch.
Every operator that definition makes (the splits and merges of DALI's conditionals included) is
recorded into the shared IR (graph.py), which is lowered, built and run as every compiled unit
is (units/build.py, execution/runtime.py).

Random ops (the per-sample random stream, docs/per-sample.md): the eager loop
`[augment(sample) for sample in batch]` draws one state per random op call, sample 0's calls in
order, then sample 1's...; which calls a sample makes depends on its path. A pipeline's random
op cannot reproduce that (it reads one state per batch), so each call's values are computed
before the run by the eager op, for a guess of every sample's path (`RandomStream`); the run
also outputs which samples reached each random op inside a branch (and the values of per-sample
arguments), and the call runs again, with the paths settled so far, until the run confirms the
guess: then the values are exactly the eager loop's, and the generators advance by its draws.
A call not settled in `_MAX_RUNS` runs switches the function to the eager loop (warned).
Random ops with a data input (noise, random crops) run the function as the eager per-sample
loop (with a warning at the line).

Its modules, lowest first: conditions.py (per-sample values, the helpers the rewritten code
calls), rewrite.py (the AST rewrite), definition.py (defining the pipeline), gather.py (what a
call returns: the eager loop's results gathered, a run's outputs the same), graph.py (the
definition recorded as a Graph), random_stream.py (`RandomStream`: the random ops' values),
function.py (`PerSampleFunction`, `_MAX_RUNS`).
"""

from ...core.errors import PerSampleError
from .function import PerSampleFunction
from .rewrite import Converted, convert

__all__ = ["Converted", "PerSampleError", "PerSampleFunction", "convert"]
