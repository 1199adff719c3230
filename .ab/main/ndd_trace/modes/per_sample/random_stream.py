"""The per-sample random stream: the values of a per-sample function's random ops, as the eager
per-sample loop draws them (docs/per-sample.md).

    stream = RandomStream(definition, args, batch_size)
    values, guessed = stream.assign(None)    # fed to the run; then observe, settle, commit
"""

from __future__ import annotations

from typing import Any

from ... import _dali
from .conditions import Sample
from .definition import Definition


class RandomStream:
    """The random values of one call: what the eager loop `[f(s) for s in batch]` draws.

    The eager loop draws, for each random op call a sample makes, one state from the call's
    generator: sample 0's calls in program order, then sample 1's, and so on. Which calls a
    sample makes depends on its path. `assign` takes a guess of every sample's path and gives
    each random op call on it the next state in that order (its value computed by the eager op
    with that state); the run then reports the paths taken (`observe`). If they are the guess,
    the values are the eager loop's: by induction over the samples, each sample starts where
    the eager loop starts it and takes its path with its values. If not, the first (sample,
    random op) where the guess was wrong was decided in the run with the eager loop's values:
    the next guess takes the run's paths up to there (`settle`), so it is right on a longer
    prefix, and the loop would end after at most batch size x random ops runs (it stops at
    function.py's `_MAX_RUNS`, and the eager loop runs instead). Usually it ends
    after one run (the guess evaluates predicates on random values and input shapes in
    Python) or two (predicates on data computed in the pipeline are taken from the first)."""

    def __init__(self, definition: Definition, args: tuple, batch_size: int):
        self._definition = definition
        self._args = args
        self._batch_size = batch_size
        self._shapes: dict[int, list] = {}
        self._rngs = [site.rng if site.rng is not None else _dali.default_rng()
                      for site in definition.random_sites]
        self._clones = {id(rng): _dali.rng_clone(rng) for rng in self._rngs}
        self._states: dict[int, list] = {key: [] for key in self._clones}
        self._used: dict[int, int] = {}
        self._settled = (-1, -1)  # the (sample, random op) up to which the paths are known
        self.last_settled = 0  # the random op of the last (sample, random op) settled
        self._values: dict[tuple, Any] = {}  # (site, state, arguments) -> value
        self._functions = [_dali.op_function_of(site.op_class)
                           for site in definition.random_sites]

    def shapes(self, argument: int) -> list:
        if argument not in self._shapes:
            self._shapes[argument] = self._args[argument].shape
        return self._shapes[argument]

    def _state(self, rng: Any, number: int) -> Any:
        states = self._states[id(rng)]
        while len(states) <= number:  # drawn from a clone: the generator moves at commit
            states.append(_dali.draw_state(self._clones[id(rng)]))
        return states[number]

    def _value(self, site: int, state: Any, arguments: tuple) -> Any:
        key = (site, state.tobytes(), arguments)
        if key not in self._values:
            spec = self._definition.random_sites[site]
            per_sample = {name: _dali.array_of(value) for name, value in arguments}
            self._values[key] = self._functions[site](
                **spec.static, **per_sample, device=spec.device, rng=_dali.ReplayRNG(state))
        return self._values[key]

    def _placeholder(self, site: int) -> Any:
        """The value fed for samples that do not reach the op (the branch drops it), or whose
        arguments are not known yet: the op's own value for an all-zero state (and its default
        per-sample arguments), so that its type and shape fit."""
        spec = self._definition.random_sites[site]
        if spec.placeholder is None:
            spec.placeholder = self._functions[site](
                **spec.static, device=spec.device,
                rng=_dali.ReplayRNG(_dali.zero_state())).evaluate()
        return spec.placeholder

    def _known(self, index: int, site: int) -> bool:
        return (index, site) <= self._settled

    def _reaches(self, site: int, sample: Sample, observed: list | None) -> bool:
        """The guess: whether this sample reaches this random op."""
        if not self._definition.random_sites[site].chain:
            return True
        if self._known(sample.index, site):  # observed with the eager loop's values
            return site in observed[sample.index]
        unknown = False
        for key, branch in self._definition.random_sites[site].chain:
            predicate = self._definition.predicates.get(key)
            if predicate is None:
                unknown = True
                continue
            try:
                taken = predicate(sample)
            except Exception:  # noqa: BLE001 (a guess only: the run decides)
                unknown = True
                continue
            if taken != branch:
                return False
        if not unknown:
            return True
        return observed is None or site in observed[sample.index]

    def assign(self, observed: list | None) -> tuple[list, list]:
        """The values to feed (one batch per random op) and the paths guessed (for each
        sample, the random ops it reaches, with their per-sample arguments; None where not
        known), given the paths of the last run (None: none yet)."""
        sites = self._definition.random_sites
        per_site: list[list] = [[] for _ in sites]
        guessed = []
        used = {key: 0 for key in self._clones}
        with _dali.synchronous_cpu():  # many small op calls: no hand-off to a worker thread
            for index in range(self._batch_size):
                sample = Sample(self, index)
                path: dict[int, tuple | None] = {}
                for site, rng in enumerate(self._rngs):
                    if self._reaches(site, sample, observed):
                        arguments: tuple | None = ()
                        if sites[site].arguments:  # the last run's, where it reached the op
                            arguments = observed[index].get(site) if observed else None
                        state = self._state(rng, used[id(rng)])
                        used[id(rng)] += 1
                        path[site] = arguments
                        if arguments is None:
                            value = self._placeholder(site)
                        else:
                            value = self._value(site, state, arguments)
                            sample.values[site] = value
                    else:
                        value = self._placeholder(site)
                    per_site[site].append(value)
                guessed.append(path)
        self._used = used
        return [_dali.storage_of(_dali.batch_of(values)) for values in per_site], guessed

    def settle(self, guessed: list, observed: list) -> None:
        """Mark the paths as known up to the first (sample, random op) where the run differs
        from the guess: up to there the run had the eager loop's values (see the class)."""
        for index, (guess, taken) in enumerate(zip(guessed, observed)):
            if guess != taken:
                self._settled = (index, min(site for site in guess.keys() | taken.keys()
                                            if guess.get(site, 0) != taken.get(site, 0)))
                self.last_settled = self._settled[1]
                return

    def observe(self, outputs: tuple) -> list:
        """The paths the run took: for each sample, the random ops it reached, with the
        values of their per-sample arguments."""
        paths: list[dict] = [{} for _ in range(self._batch_size)]
        for site, spec in enumerate(self._definition.random_sites):
            indices = _dali.host_ints(outputs[spec.reach]) if spec.reach is not None \
                else range(self._batch_size)
            arguments = [[(name, value) for value in _dali.host_samples(outputs[output])]
                         for name, output in spec.arguments]
            for position, index in enumerate(indices):
                paths[index][site] = tuple(values[position] for values in arguments)
        return paths

    def commit(self) -> None:
        """Advance each generator by the draws of the paths taken, as the eager loop does."""
        for rng in {id(rng): rng for rng in self._rngs}.values():
            _dali.rng_advance(rng, self._used[id(rng)] * _dali.STATE_WORDS)
