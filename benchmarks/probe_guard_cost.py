"""What a compiled method's guard key costs a call, where the object is more than the method
reads: ms a call and the traces made, for eager beside the compiled method.

- `method`: a compiled method calling a helper method of `self` (which reads `self.size`),
  a step counter bumped on `self` before every call (read by nothing);
- `model`: a compiled `preprocess` method of an nn.Module of WIDTH x WIDTH linear layers
  (8 of them), which reads `self.crop` only, calling `super().preprocess(x)`.

    PYTHONPATH=. python benchmarks/probe_guard_cost.py [WIDTH]      # default 2048: 33M weights
"""
import sys
import time

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import torch

import ndd_trace


class Augment:
    def __init__(self):
        self.size, self.steps = 8, 0

    def _crop(self, x):
        return ndd.crop(x, crop=[self.size, self.size])

    def step(self, x):
        return ndd.flip(self._crop(x), horizontal=1)


class Base(torch.nn.Module):
    def preprocess(self, x):
        return ndd.flip(x, horizontal=1)


class Model(Base):
    def __init__(self, width):
        super().__init__()
        self.crop = 8
        self.body = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)])

    def preprocess(self, x):
        return ndd.crop(super().preprocess(x), crop=[self.crop, self.crop])


def timed(call, calls=200, rounds=3):
    for _ in range(10):
        call()
    best = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best.append((time.perf_counter() - start) / calls * 1e3)
    return min(best)


def main():
    width = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    images = ndd.as_batch([np.zeros((16, 16, 3), np.uint8)] * 4, layout="HWC")
    augment, model = Augment(), Model(width)
    weights = sum(p.numel() for p in model.parameters())
    for name, function, target, bump in (
            ("method", Augment.step, augment, lambda: setattr(augment, "steps", augment.steps + 1)),
            ("model", Model.preprocess, model, lambda: None)):
        compiled = ndd_trace.compile(function)
        eager_ms = timed(lambda: (bump(), function(target, images).evaluate()))
        compiled_ms = timed(lambda: (bump(), compiled(target, images).evaluate()))
        print(f"{name:7s} eager {eager_ms:7.3f} ms  compiled {compiled_ms:7.3f} ms  "
              f"traces {compiled.cache_info().traces}  fallbacks {compiled.cache_info().fallbacks}"
              + (f"  ({weights / 1e6:.1f}M weights)" if name == "model" else ""))


if __name__ == "__main__":
    main()
