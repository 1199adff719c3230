"""What a per-sample function returns for a batch: each sample's result gathered, the structure
kept (tuples, lists, dicts, namedtuples: trees.py), each Tensor and each Python number batched
over the samples by `ndd.batch`, as `ndd.batch([fn(s) for s in batch])` batches them (a Python
int to int32, a float to float32, a bool to bool; its errors too); any other value (None, a
string) the first sample's.

    out = gather(per_sample_results, name)                     # the eager per-sample loop
    out = rebuilt(definition.output_tree, outputs, batch_size)  # a compiled call, the same
"""

from __future__ import annotations

import numbers
from typing import Any

from ... import _dali
from ...core import trees


def is_number(value: Any) -> bool:
    """A Python (or numpy) number, which the per-sample loop batches (`ndd.batch`)."""
    return isinstance(value, numbers.Number)


def gather(results: list, name: str) -> Any:
    """The eager per-sample loop's results (one per sample) gathered into one structure: a
    Batch per position of a Tensor or number in it (`return y, y`: two Batches, as the loop
    batches each position)."""
    by_sample: list[list] = []
    shapes = []
    for result in results:
        leaves: list = []

        def leaf(value: Any, leaves: list = leaves) -> tuple | None:
            if isinstance(value, _dali.Tensor) or is_number(value):
                leaves.append(value)
                return ("out", len(leaves) - 1)
            return None

        tree = trees.flatten(result, leaf)
        by_sample.append([leaves[node[1]] for node in tree.nodes if node[0] != "static"])
        shapes.append((tree, [node[0] for node in tree.nodes]))
    first, first_kinds = shapes[0]
    for index, (tree, kinds) in enumerate(shapes[1:], 1):
        if tree.spec != first.spec or kinds != first_kinds:
            raise ValueError(
                f"per-sample function `{name}` returned {tree.spec} for sample {index} and "
                f"{first.spec} for sample 0: the samples' results cannot be gathered into "
                "Batches. Return the same structure for every sample")
    positions = iter(range(len(by_sample[0])))
    nodes = [node if node[0] == "static" else ("out", next(positions)) for node in first.nodes]
    return trees.unflatten(trees.Tree(first.spec, nodes), lambda node: _dali.batch_of(
        [values[node[1]] for values in by_sample]))


def rebuilt(tree: trees.Tree, outputs: tuple, batch_size: int) -> Any:
    """A compiled call's result, as `gather` gives the eager loop's: its pipeline's outputs
    (`("out", i)`: a Batch; `("number", i)`: per-sample numbers, read back as eager's `.item()`
    reads them and batched as eager batches them) and its constants (`("constant", value)`: the
    same number for every sample)."""

    def leaf(node: tuple) -> Any:
        kind, where = node
        if kind == "number":
            return _dali.batch_of(_dali.python_numbers(outputs[where]))
        if kind == "constant":
            return _dali.batch_of([where] * batch_size)
        return _dali.wrap_batch(outputs[where])

    return trees.unflatten(tree, leaf)
