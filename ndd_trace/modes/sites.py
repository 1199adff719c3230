"""Transparent mode's call-site cache: a loop records the same calls every step, and a call
given what its site's last call was given is made from that call, not recorded again.

A loop records the same calls every step. Where a call site's call is given what its
last recorded call was given (the same static arguments, token for token, and data with
the same metadata), recording it again would derive the same backend, static arguments
and output metadata: the node is made from the site's last call instead (no argument
normalization, freezing or inference). Anything else is recorded as usual.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import _dali
from ..core.ir import Node, Ref
from ..tracing.trace import is_concrete_data
from .proxies import lazy_handle, node_of

_IGNORED_KWARGS = frozenset(("_backend", "_caller_frame"))  # what recording drops too
_DATA, _RNG = object(), object()  # argument tokens: recorded data; a random op's generator
MAX_SITES = 4096
_SITE_FIELDS = ("name", "schema", "backend", "arg_casts", "static", "frozen_static",
                "num_outputs", "output_names", "is_batch", "loc")


@dataclasses.dataclass(eq=False)
class _Site:
    """A call site's last recorded call: what it was given, and its node (whose derived
    fields, shared and never changed, a replayed call reuses)."""

    arguments: tuple  # (name, token) per keyword argument, in call order
    input_metas: tuple
    arg_metas: dict  # data keyword arguments: name -> metadata
    converted: tuple  # numbers and lists eager ndd passes as per-call tensor arguments
    is_random: bool
    fields: dict  # the recorded node's derived fields (_SITE_FIELDS), passed to add_op
    instance: tuple | None  # eager's operator instance: (key, construction arguments, batch size)


class CallSites:
    """The last recorded call of each call site of one tracer, `(op, code, instruction)` ->
    `_Site`, and the replays made from them."""

    def __init__(self, tracer: Any):
        self._tracer = tracer
        self._sites: dict[tuple, _Site] = {}

    def get(self, site_key: tuple | None) -> _Site | None:
        return self._sites.get(site_key) if site_key is not None else None

    def keep_eager_instance(self, op_class: type, node: Node, kwargs: dict,
                             call_frame: Any) -> tuple | None:
        """Leave an operator instance in the EvalContext's cache where the eager call would
        (code that inspects `EvalContext._instance_cache` finds eager's entries); its key and
        construction arguments, for the call site's replays. None where eager's view of the
        call site is not known (code ndd_trace generated)."""
        if call_frame is None:
            return None
        split = _dali.eager_split(op_class, call_frame, kwargs)
        arg_metas = {}
        for name in split.call_args:
            ref = node.arg_inputs.get(name)
            if ref is not None:
                arg_metas[name] = ref.node.meta[ref.index]
            elif name != "_random_state":  # a Python number recording keeps static
                with _dali.eager_inside_trace():
                    arg_metas[name] = _dali.tensor_argument_meta(op_class, name, kwargs[name])
        key = _dali.eager_instance_key(
            op_class, node.backend, _dali.current_device_id(),
            node.batch_size if node.is_batch else None, split,
            [ref.node.meta[ref.index] for ref in node.inputs], arg_metas)
        _dali.keep_eager_instance(op_class, key, split.init_args)
        return key, split.init_args, node.batch_size if node.is_batch else None

    def remember(self, site_key: tuple, result: Any, inputs: tuple, kwargs: dict,
                       instance: tuple | None) -> None:
        node = node_of(result)
        arguments = self.describe_arguments(node.op_class, kwargs)
        if arguments is None or not all(self.replayable_input(value) for value in inputs
                                        if value is not None):
            self._sites.pop(site_key, None)
            return
        if len(self._sites) >= MAX_SITES:
            self._sites.clear()
        converted = tuple(key for key in node.arg_inputs
                          if type(kwargs.get(key)) in _dali.SPLIT_VALUES)
        self._sites[site_key] = _Site(
            arguments=arguments,
            input_metas=tuple(ref.node.meta[ref.index] for ref in node.inputs),
            arg_metas={key: ref.node.meta[ref.index] for key, ref in node.arg_inputs.items()
                       if key != "_random_state"},
            converted=converted,
            instance=instance,
            is_random="_random_state" in node.arg_inputs,
            # the node's derived fields as recorded (its metadata may be refined later, from
            # that call's data), not the node: it would keep its results alive
            fields={name: getattr(node, name) for name in _SITE_FIELDS} | {
                "meta": list(node.meta), "input_devices": list(node.input_devices)})

    def describe_arguments(self, op_class: type, kwargs: dict) -> tuple | None:
        """(name, token) per keyword argument: a static value's token, or "data" for a value
        recorded by this tracer (compared by its metadata); None if one has neither."""
        described = []
        for key, value in kwargs.items():
            if value is None or key in _IGNORED_KWARGS:  # (recording drops them too)
                continue
            if key == "rng" and _dali.is_random(op_class):
                described.append((key, _RNG))
                continue
            handle = lazy_handle(value)
            if handle is not None and handle.pending and handle.tracer is self._tracer:
                described.append((key, _DATA))
                continue
            token = _dali.argument_token(value)
            if token is None:
                return None
            described.append((key, token))
        return tuple(described)

    def replayable_input(self, value: Any) -> bool:
        """A value this tracer recorded, or concrete ndd data (fed as a constant), a lazy value
        that ran included (an op given user data runs at its call)."""
        handle = lazy_handle(value)
        if handle is not None:
            return not handle.pending or handle.tracer is self._tracer
        return is_concrete_data(value)

    def replay(self, site: _Site, op_class: type, inputs: tuple, kwargs: dict) -> Any:
        """This call recorded from its site's last call, if it was given the same (else None)."""
        tracer = self._tracer
        if self.describe_arguments(op_class, kwargs) != site.arguments:
            return None
        data = [kwargs[key] for key in site.arg_metas  # the data arguments, in call order
                if key not in site.converted]
        if any(lazy_handle(value).meta != meta
               for value, meta in zip(data, site.arg_metas.values())):
            return None
        inputs = tuple(value for value in inputs if value is not None)
        if len(inputs) != len(site.input_metas) or not all(
                self.replayable_input(value) for value in inputs):
            return None
        fields = site.fields
        is_batch, loc = fields["is_batch"], fields["loc"]
        # batch or sample mode, as recording decides it: the batch_size argument, else the
        # first Batch among the inputs, then the data arguments (all of one size: recording
        # leaves batches of different sizes to ndd, which rejects them)
        batch_size = kwargs.get("batch_size")
        if batch_size is None:
            sizes = [value.batch_size for value in (*inputs, *data)
                     if isinstance(value, _dali.Batch)]
            if sizes:
                batch_size = sizes[0]
                if any(size != batch_size for size in sizes):
                    return None
        if (batch_size is not None) != is_batch:
            return None
        refs = [tracer.ref_of(value, is_batch, loc) for value in inputs]
        if any(ref.node.meta[ref.index] != meta for ref, meta in zip(refs, site.input_metas)):
            return None  # (constants made for the inputs are left unused)
        tracer.note_call_mode(batch_size, site.is_random, loc)
        arg_inputs = {}
        for key in site.arg_metas:
            if key in site.converted:  # the same value (its token): converted as recorded
                value = tracer.tensor_argument(op_class, key, kwargs[key], batch_size)
                arg_inputs[key] = tracer.ref_of(value, is_batch, loc)
            else:
                arg_inputs[key] = lazy_handle(kwargs[key]).ref
        if site.instance is not None:
            key, init_args, recorded_batch_size = site.instance
            if batch_size != recorded_batch_size:
                key = _dali.eager_instance_key_for_batch(key, int(batch_size or 1))
            _dali.keep_eager_instance(op_class, key, init_args)
        if site.is_random:
            state = tracer.graph.add_random_state(tracer.rng_slot(kwargs.get("rng"), loc), loc)
            arg_inputs["_random_state"] = Ref(state, 0)
        return tracer.record_op(**fields, op_class=op_class, batch_size=batch_size, inputs=refs,
                                arg_inputs=arg_inputs)
