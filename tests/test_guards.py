"""Guards (tracing/guards.py): what a compiled function's key holds, so that a call reuses a trace
only where eager would compute the same thing: its arguments' kinds, types and layouts, the
values it reads besides them (globals, closure variables, attributes, a helper's globals and
defaults), the batch size where Python uses it, and values equal under `==` that eager tells
apart; and what it leaves out (a reader, a compiled function it calls), so that nothing else
re-traces."""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import textwrap
import sys
import threading
import types
import warnings

import numpy as np
import pytest
import torch
from harness import Compiler, Step, assert_each_matches_eager, assert_matches_eager, assert_runs_match, \
    assert_same, run

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.tracing import aliasing, guards, plans


@pytest.mark.parametrize("change", ["dtype", "layout", "ndim", "kind", "static"])
def test_guards_retrace_on_change(change, images):
    @ndd.compile
    def double(x, factor=2):
        return x * factor

    base = ndd.as_batch(images, layout="HWC")
    double(base)
    variants = {
        "dtype": (ndd.as_batch([i.astype(np.float32) for i in images], layout="HWC"),),
        "layout": (ndd.as_batch(images, layout="WHC"),),
        "ndim": (ndd.as_batch([np.ascontiguousarray(i[..., 0]) for i in images]),),
        "kind": (ndd.as_tensor(images[0]),),
        "static": (base, 3),
    }
    args = variants[change]
    assert_same(double.__wrapped__(*args), double(*args))
    assert double.cache_info().traces == 2
    assert double.last_miss_reason and "->" in double.last_miss_reason


def test_dict_with_list_of_batches(images):
    """A batch inside a list inside a dict is guarded like a top-level one: another layout
    re-traces (found in review: it once gave a silently wrong result)."""
    @ndd.compile
    def f(inputs):
        return ndd.flip(inputs["xs"][0], horizontal=1)

    for layout in ["HWC", "CHW", "HWC"]:
        data = ndd.as_batch([np.zeros((2, 2, 3), np.float32)] * 2, layout=layout)
        assert f({"xs": [data]}).layout == layout
    assert f.cache_info().traces == 2
# -- what a compiled function reads, changed between calls -------------------------------------

GLOBAL_SIZE = [10, 10]
HELPER_ANGLE = 10.0
SCALE_PARTIAL = None
SCALER = None


class Config:
    def __init__(self):
        self.size = 8


CONFIG = Config()


class Factor:
    value = 2.0


def _helper_angle():
    return HELPER_ANGLE


def _helper_with_default(x, k=2.0):
    return x * k


def _scale(x, k):
    return x * k


class _Scaler:
    def __init__(self):
        self.k = 2.0

    def run(self, x):
        return x * self.k


def _set_global(monkeypatch, name, value):
    return lambda: monkeypatch.setitem(globals(), name, value)


def _a_global_rebound(monkeypatch):
    def resized(x):
        return ndd.resize(x, size=GLOBAL_SIZE)

    return resized, [lambda: None, _set_global(monkeypatch, "GLOBAL_SIZE", [14, 14]),
                     _set_global(monkeypatch, "GLOBAL_SIZE", [14, 14])], \
        "GLOBAL_SIZE: [10, 10] -> [14, 14]"


def _a_global_defined_after_decoration(monkeypatch):
    def rotated(x):
        return ndd.rotate(x, angle=LATE_ANGLE)  # noqa: F821 (defined by the first change)

    return rotated, [_set_global(monkeypatch, "LATE_ANGLE", 10.0),
                     _set_global(monkeypatch, "LATE_ANGLE", 20.0)], "LATE_ANGLE: 10.0 -> 20.0"


def _a_global_read_by_a_helper(monkeypatch):
    def rotated(x):
        return ndd.rotate(x, angle=_helper_angle())

    return rotated, [lambda: None, _set_global(monkeypatch, "HELPER_ANGLE", 25.0)], \
        "_helper_angle() reads HELPER_ANGLE: 10.0 -> 25.0"


def _a_closure_variable(monkeypatch):
    angle = 10.0

    def rotated(x):
        return ndd.rotate(x, angle=angle)

    def change():
        nonlocal angle
        angle = 20.0

    return rotated, [lambda: None, change], "angle: 10.0 -> 20.0"


def _an_attribute_of_a_global_object(monkeypatch):
    def resized(x):
        return ndd.resize(x, size=[CONFIG.size, CONFIG.size])

    return resized, [lambda: None, lambda: monkeypatch.setattr(CONFIG, "size", 9)], \
        "CONFIG.size: 8 -> 9"


def _a_class_attribute(monkeypatch):
    def scaled(x):
        return ndd.cast(x, dtype=ndd.float32) * Factor.value

    return scaled, [lambda: None, lambda: monkeypatch.setattr(Factor, "value", 3.0)], \
        "Factor.value: 2.0 -> 3.0"


def _a_global_partial(monkeypatch):
    import functools

    def call(x):
        return SCALE_PARTIAL(x)

    def bind(k):
        return _set_global(monkeypatch, "SCALE_PARTIAL", functools.partial(_scale, k=k))

    return call, [bind(2.0), bind(3.0), bind(3.0)], "SCALE_PARTIAL.keywords['k']: 2.0 -> 3.0"


def _a_global_bound_method(monkeypatch):
    owner = _Scaler()
    monkeypatch.setitem(globals(), "SCALER", owner.run)

    def call(x):
        return SCALER(x)

    def set_k(k):
        return lambda: setattr(owner, "k", k)

    return call, [set_k(2.0), set_k(3.0), set_k(3.0)], "SCALER.__self__.k: 2.0 -> 3.0"


def _a_helpers_defaults(monkeypatch):
    def call(x):
        return _helper_with_default(x)

    def defaults(value):
        return lambda: monkeypatch.setattr(_helper_with_default, "__defaults__", value)

    return call, [lambda: None, defaults((3.0,)), defaults((2.0,))], \
        "_helper_with_default.__defaults__[0]: 2.0 -> 3.0"


_READ_BY_TEXT = 1
_TABLE_SCALE = 2


def _by_globals(x):
    return x + globals()["_READ_BY_TEXT"]


def _by_getattr(x):
    return x + getattr(sys.modules[__name__], "_READ_BY_TEXT")


def _by_sys_modules(x):
    return x + sys.modules[__name__]._READ_BY_TEXT


def _scaled_by_a_global(x):
    return x * _TABLE_SCALE


_TRANSFORMS = {"scale": _scaled_by_a_global}


def _through_a_table(x):
    return _TRANSFORMS["scale"](x)


class _HeldHelper:
    def __init__(self):
        self.fn = _scaled_by_a_global

    def __call__(self, x):
        return self.fn(x)


_HOLDER = _HeldHelper()


def _through_an_attribute(x):
    return _HOLDER(x)


class _Augmenting:
    def __init__(self):
        self.fn = _scaled_by_a_global

    def augment(self, x):
        return self._inner(x)

    def _inner(self, x):
        return x * _TABLE_SCALE


class _Pipeline:
    def __init__(self):
        self.aug = _Augmenting()

    def __call__(self, x):
        return self.aug.augment(x)


def _apply(augment, x):
    return augment.augment(x)


_GLOBAL_AUGMENT = _Augmenting()


def _through_a_global_objects_method(x):
    return _GLOBAL_AUGMENT.augment(x)


def _changing(function, name, after, reason):
    """A READS case: `function`, reading global `name`, called, then called after `name`
    became `after`, then again."""
    def case(monkeypatch):
        return function, [lambda: None, _set_global(monkeypatch, name, after),
                          _set_global(monkeypatch, name, after)], reason
    return case


# each: the function, the changes made before each of its calls (one trace for the first call,
# one more where a change changed what it reads), and the last miss reason, as the user wrote
# what changed
READS = {
    "a global rebound": _a_global_rebound,
    "a global defined after decoration": _a_global_defined_after_decoration,
    "a global read by a helper": _a_global_read_by_a_helper,
    "a closure variable": _a_closure_variable,
    "an attribute of a global object": _an_attribute_of_a_global_object,
    "a class attribute": _a_class_attribute,
    "a global functools.partial": _a_global_partial,
    "a global bound method's object": _a_global_bound_method,
    "a helper's defaults": _a_helpers_defaults,
    # found by the twenty-first session's sweep: each once gave a stale result, silently
    "a global read as globals()[name]": _changing(_by_globals, "_READ_BY_TEXT", 5,
                                                  "_READ_BY_TEXT: 1 -> 5"),
    "a global read by getattr of its module": _changing(_by_getattr, "_READ_BY_TEXT", 5,
                                                        "_READ_BY_TEXT: 1 -> 5"),
    "a global read through sys.modules": _changing(_by_sys_modules, "_READ_BY_TEXT", 5,
                                                   "_READ_BY_TEXT: 1 -> 5"),
    "a global read by a helper in a dict": _changing(
        _through_a_table, "_TABLE_SCALE", 3, "_scaled_by_a_global() reads _TABLE_SCALE: 2 -> 3"),
    "a global read by a helper an object holds": _changing(
        _through_an_attribute, "_TABLE_SCALE", 3,
        "_scaled_by_a_global() reads _TABLE_SCALE: 2 -> 3"),
    # found by the twenty-second session: a method called through a global object's `self`
    "a global read by a method a global object's method calls": _changing(
        _through_a_global_objects_method, "_TABLE_SCALE", 3, "_inner() reads _TABLE_SCALE: 2 -> 3"),
}


@pytest.mark.parametrize("case", READS)
def test_what_the_function_reads_changed_between_calls_retraces(case, batch, monkeypatch):
    """A value a compiled function reads besides its arguments (a global, a closure variable,
    an attribute, a helper's global or defaults), changed before a call: that call re-traces,
    gives eager's result, and says what changed, as the user wrote it (`last_miss_reason`); a
    call after no change, or after a change to an equal value, hits the cache. Found in review
    (a class attribute, a global defined after decoration, a global a helper reads) and in
    issue 35 (a global functools.partial, a global bound method's object, a helper's
    defaults): each once gave a stale result, silently."""
    function, changes, reason = READS[case](monkeypatch)
    compiled = assert_each_matches_eager(function, batch, changes=changes, warn=None)
    assert compiled.cache_info().traces == 2
    assert reason in compiled.last_miss_reason.split("; ")



# -- helpers reached through arguments (found by the twenty-second session: each gave a stale
# result, silently, after the global the helper reads changed) --------------------------------

ARGUMENT_HELPERS = {
    # name: the function, its first argument, the last miss reason
    "a method of an argument, and the method it calls": (
        lambda aug, x: aug.augment(x), _Augmenting, "aug._inner() reads _TABLE_SCALE: 2 -> 3"),
    "a function an argument holds": (
        lambda aug, x: aug.fn(x), _Augmenting, "aug.fn() reads _TABLE_SCALE: 2 -> 3"),
    "a compiled method's self, and an object it holds": (
        _Pipeline.__call__, _Pipeline, "self.aug._inner() reads _TABLE_SCALE: 2 -> 3"),
    "a function given": (
        lambda transform, x: transform(x), lambda: _scaled_by_a_global,
        "transform() reads _TABLE_SCALE: 2 -> 3"),
    "a bound method given": (
        lambda transform, x: transform(x), lambda: _Augmenting().augment,
        "transform._inner() reads _TABLE_SCALE: 2 -> 3"),
    "an argument passed on whole": (
        lambda aug, x: _apply(aug, x), _Augmenting, "aug._inner() reads _TABLE_SCALE: 2 -> 3"),
}


@pytest.mark.parametrize("case", ARGUMENT_HELPERS)
def test_globals_read_by_helpers_reached_through_arguments_are_guarded(case, batch, monkeypatch):
    """A helper the function reaches through an argument (`self.augment(x)`, the methods
    those call through `self`, a function or bound method given, an object given to another
    helper) reads a global that changes between calls: the call after the change re-traces
    and gives eager's result, and the miss names the helper as the user reached it."""
    function, make, reason = ARGUMENT_HELPERS[case]
    argument = make()
    changes = [lambda: None, _set_global(monkeypatch, "_TABLE_SCALE", 3),
               _set_global(monkeypatch, "_TABLE_SCALE", 3)]
    compiled = assert_each_matches_eager(function, argument, batch, changes=changes, warn=None)
    assert compiled.cache_info().traces == 2
    assert reason in compiled.last_miss_reason.split("; ")



# -- objects as users write them (found by the twenty-second session's sweep of object-oriented
# code: each gave a stale result, or crashed where eager ran, silently) -------------------------

_DEFAULTS = {"size": 4}
_SCALE_OF_DESCRIPTOR = 2


class _AttrDict(dict):  # the common config idiom: every missing attribute raises KeyError
    __getattr__ = dict.__getitem__


class _Options:  # unset options read as None
    def __init__(self, **given):
        self.__dict__.update(given)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _Fallback:  # a config falling back to a module's defaults
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _DEFAULTS[name]


class _Scaled:  # a descriptor reading a global
    def __get__(self, obj, owner=None):
        return _SCALE_OF_DESCRIPTOR * obj.base


class _Add:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x + self.k


class _Holder:
    size = _Scaled()

    def __init__(self):
        self.t = _Add(1)
        self.base = 2
        self.cfg = _Fallback()

    def held(self, x):
        return self.t(x)

    def indexed(self, x):
        return self[x]

    def __getitem__(self, x):
        return x + 1

    def described(self, x):
        return ndd.resize(x, size=[self.size, self.size])

    def defaulted(self, x):
        return ndd.resize(x, size=[self.cfg.size, self.cfg.size])


class _Base:
    def __init__(self):
        self.size = 4
        self.k = 1

    def __call__(self, x):
        return ndd.resize(x, size=[self.size, self.size])


class _Sub(_Base):
    def __call__(self, x):
        return super().__call__(x) + self.k


class _AddModule(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x + self.k


class _Augment(torch.nn.Module):  # transforms as torch users hold them
    def __init__(self):
        super().__init__()
        self.ts = torch.nn.ModuleList([_AddModule(1), _AddModule(2)])

    def forward(self, x):
        for t in self.ts:
            x = t(x)
        return x


class _Scaled(torch.nn.Module):  # a model's preprocessing, as a method beside its layers
    def __init__(self):
        super().__init__()
        self.k = 1
        self.register_buffer("gain", torch.tensor([2.0]))
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))

    def _shift(self, x):
        return x + self.k

    def scaled(self, x):
        return self._shift(x) * float(self.gain[0])


def _setting(target, name, value, monkeypatch):
    return lambda: monkeypatch.setattr(target, name, value)


OBJECTS = {
    # name: (function, make its object, the changes before each call, given the object)
    "a config whose __getattr__ raises KeyError": (
        lambda x, cfg: ndd.resize(x, size=[cfg.size, cfg.size]), lambda: _AttrDict(size=4),
        lambda cfg, mp: [lambda: None, lambda: cfg.update(size=6)]),
    "a config whose __getattr__ answers None": (
        lambda x, cfg: ndd.flip(x, horizontal=1) if cfg.flip else x, lambda: _Options(),
        lambda cfg, mp: [lambda: None, lambda: setattr(cfg, "flip", True)]),
    "__call__ replaced on the class of an object held": (
        lambda x, h: h.held(x), _Holder,
        lambda h, mp: [lambda: None, _setting(_Add, "__call__", lambda self, x: x * 3, mp)]),
    "__getitem__ replaced on the class": (
        lambda x, h: h.indexed(x), _Holder,
        lambda h, mp: [lambda: None, _setting(_Holder, "__getitem__", lambda self, x: x * 3, mp)]),
    "a global read by a descriptor's __get__": (
        lambda x, h: h.described(x), _Holder,
        lambda h, mp: [lambda: None, _set_global(mp, "_SCALE_OF_DESCRIPTOR", 3)]),
    "a global read by __getattr__": (
        lambda x, h: h.defaulted(x), _Holder,
        lambda h, mp: [lambda: None, _setting(sys.modules[__name__], "_DEFAULTS", {"size": 6},
                                              mp)]),
    "an attribute of a transform in an nn.ModuleList": (
        lambda x, m: m(x), _Augment,
        lambda m, mp: [lambda: None, lambda: setattr(m.ts[0], "k", 5)]),
    "a forward hook registered on a submodule": (
        lambda x, m: m(x), _Augment,
        lambda m, mp: [lambda: None, lambda: m.ts[1].register_forward_hook(
            lambda module, given, out: out * 2)]),
    "a buffer of a module, filled in place": (
        lambda x, m: m.scaled(x), _Scaled,
        lambda m, mp: [lambda: None, lambda: m.gain.fill_(3.0)]),
    "an attribute read by a module's helper method": (
        lambda x, m: m.scaled(x), _Scaled,
        lambda m, mp: [lambda: None, lambda: setattr(m, "k", 4)]),
    "a module's helper method replaced on the class": (
        lambda x, m: m.scaled(x), _Scaled,
        lambda m, mp: [lambda: None, _setting(_Scaled, "_shift", lambda self, x: x - self.k,
                                              mp)]),
    "a module's helper method shadowed on the object": (
        lambda x, m: m.scaled(x), _Scaled,
        lambda m, mp: [lambda: None, lambda: setattr(m, "_shift", lambda x: x * 5)]),
    "an attribute read by the method super() calls": (
        lambda x, s: s(x), _Sub, lambda s, mp: [lambda: None, lambda: setattr(s, "size", 6)]),
}


@pytest.mark.parametrize("case", OBJECTS)
def test_objects_as_users_write_them_are_guarded_without_running_their_code(case, batch,
                                                                             monkeypatch):
    """Configs with a `__getattr__` of their own (an AttrDict raising KeyError, one answering
    None: the guards ran them, and every compiled call crashed), a dunder method replaced on
    the class (`__call__`, `__getitem__`: not in the class's key), a global read by a
    descriptor's `__get__` or by `__getattr__`, an attribute read by the method `super()`
    calls, a transform's attribute in an nn.ModuleList (torch's tables of submodules counted
    as one attribute each): each call gives eager's result (each once stayed at the first call's)."""
    function, make, changes = OBJECTS[case]
    target = make()
    assert_each_matches_eager(function, batch, target, changes=changes(target, monkeypatch),
                              warn=None)


def test_a_module_is_keyed_by_what_its_method_reads_not_by_its_weights(batch):
    """A compiled method of an nn.Module reading `self.k` through a helper method and a buffer
    is keyed by those (and the helpers' code), not by the layers it never reads: training the
    weights in place re-traces nothing, and the key does not copy them (it hashed every
    parameter within four levels at each call: 90 ms a call beside a 33M-parameter model)."""
    model = _Scaled()
    step = ndd_trace.compile(_Scaled.scaled)
    for _ in range(2):
        assert_same(_Scaled.scaled(model, batch), step(model, batch))
        with torch.no_grad():
            model.body[0].weight.add_(1.0)
    assert step.cache_info().traces == 1
    key = guards.build_key((model, batch), {}, plans.plan_for(_Scaled.scaled))
    assert [label for label, _ in key if label.startswith("self")] == [
        "self._shift", "self.k", "self.gain"], key


# -- what an object holds, reached as users write it (the twenty-fourth session's sweep: each of
#    these once gave the first call's result after the change) -----------------------------------

_HELD_ANGLE = 10.0


class _RotateByGlobal:
    def __call__(self, x):
        return ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True)


class _Compose:  # a transform list, as torchvision's Compose holds it
    def __init__(self):
        self.transforms = [_RotateByGlobal(), _FlipBy(1)]
        self.ops = [self.rotate, self.flip]  # bound methods in a table
        self.fn = functools.partial(_rotate_then_flip, flip=1)
        self.crop = _Deep()

    def rotate(self, x):
        return ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True)

    def flip(self, x):
        return ndd.flip(x, horizontal=1)

    def all_transforms(self, x):
        for transform in self.transforms:
            x = transform(x)
        return x

    def all_ops(self, x):
        for op in self.ops:
            x = op(x)
        return x

    def held_partial(self, x):
        return self.fn(x)

    def op(self, x):
        return ndd.flip(x, horizontal=1)

    def own_op(self, x):
        return self.op(x)

    def deep_crop(self, x):
        return ndd.crop(x, crop=self.crop.train.aug.size.hw)


class _FlipBy:
    def __init__(self, horizontal):
        self.horizontal = horizontal

    def __call__(self, x):
        return ndd.flip(x, horizontal=self.horizontal)


class _Deep:  # a config five attributes deep: self.crop.train.aug.size.hw
    def __init__(self):
        self.train = types.SimpleNamespace(aug=types.SimpleNamespace(
            size=types.SimpleNamespace(hw=[12, 12])))


def _rotate_then_flip(x, flip):
    return ndd.flip(ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True), horizontal=flip)


class _RotateModule(torch.nn.Module):
    def forward(self, x):
        return ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True)


class _Preprocess(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rot = _RotateModule()
        self.gain = torch.tensor([2.0], dtype=torch.bfloat16)

    def rotated(self, x):
        return self.rot(x)

    def scaled(self, x):
        return x * float(self.gain[0])


class _Base:
    MEAN = torch.tensor([10.0, 20.0, 30.0])

    def op(self, x):
        return ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True)

    def normalized(self, x):
        return ndd.crop_mirror_normalize(x, mean=self.MEAN.tolist(), std=[1.0])


class _Derived(_Base):
    def op(self, x):
        return ndd.flip(super().op(x), horizontal=1)

    def run(self, x):
        return self.op(x)

    def normalized(self, x):  # (`super()`: its `self` read whole)
        return super().normalized(x)


class _Size:  # compared by value on two of its three attributes
    __slots__ = ("h", "w", "flip")

    def __init__(self):
        self.h, self.w, self.flip = 8, 8, 0

    def __eq__(self, other):
        return isinstance(other, _Size) and (self.h, self.w) == (other.h, other.w)

    def __hash__(self):
        return hash((self.h, self.w))


class _Trained(torch.nn.Module):  # a model whose preprocessing extends its base's
    def __init__(self):
        super().__init__()
        self.steps = 0
        self.body = torch.nn.Linear(16, 16)
        self.rot = _RotateModule()

    def preprocess(self, x):
        return ndd.flip(x, horizontal=1)


class _TrainedMore(_Trained):
    def preprocess(self, x):
        return self.rot(super().preprocess(x))


class _Rotate:
    def __init__(self, angle):
        self.angle = angle

    def __call__(self, x):
        return ndd.rotate(x, angle=self.angle, keep_size=True)


class _Composed:  # torchvision's Compose, nested
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for transform in self.transforms:
            x = transform(x)
        return x


def _logged(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        return method(*args, **kwargs)
    return wrapper


class _Decorated:
    def __init__(self):
        self.angle = 10.0
        self.nested = _Composed([_Composed([_Composed([_Rotate(10.0)])])])

    @_logged
    def rotated(self, x):
        return ndd.rotate(x, angle=self.angle, keep_size=True)

    def run(self, x):
        return self.rotated(x)


class _CompiledCall:
    @ndd_trace.compile
    def __call__(self, x):
        return ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True)


class _Defaults:
    ANGLE = 10.0

    @classmethod
    def angle(cls):
        return cls.ANGLE


class _Overriding(_Defaults):
    def __init__(self):
        self.ANGLE = 99.0  # (the object's own: the class method reads its class's)

    def run(self, x):
        return ndd.rotate(x, angle=super().angle(), keep_size=True)


class _NestedConfig:
    class aug:  # noqa: N801 (a config written as nested classes)
        angle = 10.0


def _rotate_by_config(x, cfg):
    return _by_config(x, cfg)


def _by_config(x, cfg):
    return ndd.rotate(x, angle=cfg.aug.angle, keep_size=True)


def _helper1(x):
    return _helper2(x)


def _helper2(x):
    return _helper3(x)


def _helper3(x):
    return _helper4(x)


def _helper4(x):
    return ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True)


_GLOBAL_TRANSFORMS = [_RotateByGlobal()]
_GLOBAL_PARTIAL = functools.partial(_rotate_then_flip, flip=1)


@functools.cache
def _cached_angle():
    return _HELD_ANGLE


def _rotate_by_methodtype(self, x):
    return ndd.rotate(x, angle=_HELD_ANGLE, keep_size=True)


def _global_transforms(x):
    for transform in _GLOBAL_TRANSFORMS:
        x = transform(x)
    return x


def _angle_changed(mp):
    return _set_global(mp, "_HELD_ANGLE", 45.0)


def _then_the_angle(_, mp):
    """The changes before each call: none, then the global angle 10 -> 45."""
    return [lambda: None, _angle_changed(mp)]


def _cleared_after_the_angle_changed(mp):
    """The angle changed (the cache still answers 10, eagerly too), then the cache cleared and
    filled again by an eager call: eager's next answer is 45."""
    def change():
        mp.setitem(globals(), "_HELD_ANGLE", 45.0)
        _cached_angle.cache_clear()
        _cached_angle()
    return change


HELD = {
    # name: (function, make its object, the changes before each call, given the object)
    "a transform in a list the object holds reads a global": (
        lambda x, c: c.all_transforms(x), _Compose, _then_the_angle),
    "a bound method in a table reads a global": (
        lambda x, c: c.all_ops(x), _Compose, _then_the_angle),
    "a partial the object holds calls a function reading a global": (
        lambda x, c: c.held_partial(x), _Compose, _then_the_angle),
    "a method set on the object reads a global": (
        lambda x, c: c.own_op(x), _Compose, lambda c, mp: [
            lambda: None, lambda: setattr(c, "op", types.MethodType(_rotate_by_methodtype, c)),
            _angle_changed(mp)]),
    "a list five attributes deep, changed in place": (
        lambda x, c: c.deep_crop(x), _Compose, lambda c, mp: [
            lambda: None, lambda: c.crop.train.aug.size.hw.__setitem__(0, 8)]),
    "a list five attributes deep, replaced": (
        lambda x, c: c.deep_crop(x), _Compose, lambda c, mp: [
            lambda: None, lambda: setattr(c.crop.train.aug.size, "hw", None),
            lambda: setattr(c.crop.train.aug.size, "hw", [8, 8])]),
    "a transform in a global list reads a global": (
        lambda x, _: _global_transforms(x), lambda: None, _then_the_angle),
    "a global partial's function reads a global": (
        lambda x, _: _GLOBAL_PARTIAL(x), lambda: None, _then_the_angle),
    "an nn.Module's submodule reads a global in forward": (
        lambda x, m: m.rotated(x), _Preprocess, _then_the_angle),
    "a class attribute tensor, replaced": (
        lambda x, d: d.normalized(x), _Derived, lambda d, mp: [
            lambda: None, lambda: mp.setattr(_Base, "MEAN", torch.tensor([99.0] * 3))]),
    "a bfloat16 tensor changed in place": (
        lambda x, m: m.scaled(x), _Preprocess, lambda m, mp: [lambda: None,
                                                             lambda: m.gain.mul_(2)]),
    "the base's submodule, reached through super(), reads a global": (
        lambda x, m: m.preprocess(x), _TrainedMore, _then_the_angle),
    "a transform in Composes three deep, changed in place": (
        lambda x, d: d.nested(x), _Decorated, lambda d, mp: [
            lambda: None,
            lambda: setattr(d.nested.transforms[0].transforms[0].transforms[0], "angle", 45.0)]),
    "a method wrapped by a decorator reads its object": (
        lambda x, d: d.run(x), _Decorated, lambda d, mp: [lambda: None,
                                                         lambda: setattr(d, "angle", 45.0)]),
    "a compiled __call__ reads a global": (
        lambda x, c: c(x), _CompiledCall, _then_the_angle),
    "a class method reached through super() reads its class": (
        lambda x, o: o.run(x), _Overriding, lambda o, mp: [
            lambda: None, lambda: mp.setattr(_Defaults, "ANGLE", 30.0)]),
    "a config of nested classes passed on": (
        lambda x, _: _rotate_by_config(x, _NestedConfig), lambda: None, lambda _, mp: [
            lambda: None, lambda: mp.setattr(_NestedConfig.aug, "angle", 45.0)]),
    "a global read four helper calls deep": (
        lambda x, _: _helper1(x), lambda: None, _then_the_angle),
    "the method super() reaches reads a global": (
        lambda x, d: d.run(x), _Derived, _then_the_angle),
    "a slotted object's attribute its __eq__ leaves out": (
        lambda x, size: ndd.flip(ndd.resize(x, size=[size.h, size.w]), horizontal=size.flip),
        _Size, lambda size, mp: [lambda: None, lambda: setattr(size, "flip", 1)]),
    "an lru_cache helper cleared after what it reads changed": (
        lambda x, _: ndd.rotate(x, angle=_cached_angle(), keep_size=True), lambda: None,
        lambda _, mp: [lambda: None, _angle_changed(mp), _cleared_after_the_angle_changed(mp)]),
}


@pytest.mark.parametrize("case", HELD)
def test_what_objects_hold_is_guarded_as_code_reaches_it(case, batch, monkeypatch):
    """Code reached through what an object holds (a transform list, bound methods in a table,
    a partial, a method set on the object, an nn.Module's submodules, the method `super()`
    reaches) is followed for the globals it reads; a value five attributes deep, a class's
    tensor, a bfloat16 tensor and a slotted object's attributes are keyed by value; an
    lru_cache helper cleared and filled again is another key: each call gives eager's result."""
    _cached_angle.cache_clear()
    function, make, changes = HELD[case]
    target = make()
    assert_each_matches_eager(function, batch, target, changes=changes(target, monkeypatch),
                              warn=None)


def test_a_method_calling_super_is_keyed_by_what_it_reads(batch):
    """A compiled method calling `super().preprocess(x)` is keyed by that method and what it
    reads, not by the whole object: a step counter bumped and the weights trained between
    calls re-trace nothing (every call missed, hashing every weight, once the cache limit was
    reached every call ran eagerly); the global the base's submodule reads still re-traces."""
    model = _TrainedMore()

    def train_step():
        model.steps += 1
        with torch.no_grad():
            model.body.weight.add_(1.0)

    compiled = assert_each_matches_eager(_TrainedMore.preprocess, model, batch,
                                         changes=[lambda: None, train_step, train_step],
                                         warn="error")
    assert compiled.cache_info().traces == 1


def test_what_a_call_does_not_read_re_traces_nothing(batch):
    """A weight's dtype read beside a model being trained, and an lru_cache helper that other
    code fills between calls: each call hits (each missed at every call: the weights' bytes,
    the helper's size were in the key)."""
    model = _Trained()

    def by_dtype(m, x):
        return x * (2 if m.body.weight.dtype == torch.float32 else 1)

    @functools.cache
    def angle_for(level):
        return level * 10.0

    def rotated(x):
        return ndd.rotate(x, angle=angle_for(1), keep_size=True)

    def train_step():
        with torch.no_grad():
            model.body.weight.add_(1.0)

    def other_code():  # (a new level each time: the helper holds one more answer)
        angle_for(100 + angle_for.cache_info().currsize)

    for function, args, change in ((by_dtype, (model, batch), train_step),
                                   (rotated, (batch,), other_code)):
        compiled = assert_each_matches_eager(function, *args, changes=[lambda: None, change,
                                                                       change], warn="error")
        assert compiled.cache_info().traces == 1, function


def test_an_object_keyed_by_identity_is_another_key_once_freed():
    """A value keyed by its identity (five levels down, unhashable) is a key only while that
    very object lives: another object given the same address once it is freed is another key
    (an id alone once hit the freed object's entry: the sweep saw `crop = None; crop = [8, 8]`
    reuse the address)."""
    held, other = [12, 12], [8, 8]
    key = guards.GUARDS.by_identity(held)
    assert key == guards.GUARDS.by_identity(held)
    reused = guards.GUARDS.by_identity(other)
    reused.key = key.key  # (the freed list's address, given to the new one)
    assert reused != key and hash(reused) == hash(key)


# -- the batch size -----------------------------------------------------------------------------

def _floor(number):
    import math

    return math.floor(number)


BATCH_SIZE_USES = {
    "range": lambda x: len(range(x.batch_size)), "divmod": lambda x: divmod(x.batch_size, 3)[0],
    "pos": lambda x: +x.batch_size, "floor": lambda x: _floor(x.batch_size),
    "zeros": lambda x: np.zeros(x.batch_size).size,
    "slice": lambda x: len(([1] * 9)[:x.batch_size]), "format": lambda x: "%d" % x.batch_size,
    "round": lambda x: round(x.batch_size), "bit_length": lambda x: x.batch_size.bit_length(),
    "arithmetic": lambda x: x * (x.batch_size + 1),
    "an op's argument": lambda x: ndd.random.uniform(batch_size=x.batch_size,
                                                     shape=x.batch_size),
    # found by this session's sweep: numpy made an object array of it, numpy scalars promoted
    # it as a Python int does not, and isinstance / `case int()` said it was no int
    "np.array": lambda x: np.array([x.batch_size, 7]),
    "numpy scalar": lambda x: (np.uint8(255) + x.batch_size, x.batch_size - np.int8(1),
                               np.int32(1) + x.batch_size),
    "ufunc": lambda x: np.maximum(x.batch_size, 1),
    # the twenty-third session's sweep: given to ndd as data, a 64-bit number where eager's int
    # is a 32-bit one (x * n an int64 batch, silently)
    "data": lambda x: (x * x.batch_size, x + x.batch_size, ndd.math.max(x, x.batch_size)),
    "as_tensor": lambda x: ndd.as_tensor(x.batch_size),
    "match": lambda x: _matched(x.batch_size),
}


def _matched(number):
    match number:
        case 2:
            return "two"
        case int():
            return "an int"
    return "no int"


@pytest.mark.parametrize("use", BATCH_SIZE_USES)
def test_batch_size_used_by_python_specializes(use, images):
    """The batch size used by Python (range, divmod, +n, math.floor, numpy, slicing, %-format,
    round, bit_length, arithmetic on a batch) or given as an op's argument other than
    `batch_size` specializes the trace: one trace per batch size, each with its own values; a
    size seen before hits the cache (found in review: the Python uses once gave a silently
    wrong result)."""
    def f(x):
        return ndd.flip(x), BATCH_SIZE_USES[use](x)

    compiled = ndd.compile(f)
    for n in (4, 2, 3, 4):
        data = ndd.as_batch(images[:n], layout="HWC")
        assert_runs_match(run(f, data, seed=1), run(compiled, data, seed=1, warn=None))
    assert compiled.cache_info().traces == 3


def test_the_batch_size_is_an_int_to_isinstance_without_specializing(images):
    """`isinstance(x.batch_size, int)` holds, as for eager's int (found by this session's
    sweep: it did not, so the other branch ran); asking the type reads no value, so the trace
    still serves every batch size."""
    def f(x):
        return x + 1 if isinstance(x.batch_size, int) else x - 1

    compiled = ndd.compile(f)
    for n in (4, 2, 3, 4):
        data = ndd.as_batch(images[:n], layout="HWC")
        assert_runs_match(run(f, data, seed=1), run(compiled, data, seed=1, warn=None))
    assert compiled.cache_info().traces == 1


def _kind_of(number):
    return type(number).__name__


def test_the_batch_size_is_an_int_to_type_in_the_function_and_its_helpers(images):
    """`type(x.batch_size) is int` holds and `type(n).__name__` names int, as for eager's int
    (found by the twenty-first session's sweep: `type()` named the symbolic number's class, so
    the other branch ran, silently): a function or a helper it calls that calls `type()` gets
    the batch size as an int, its trace specialized to it (one trace per batch size)."""
    def f(x):
        return x + 1 if type(x.batch_size) is int else x - 1

    def g(x):
        return ndd.cast(x, dtype=ndd.float32) if _kind_of(x.batch_size) == "int" else x

    for function in (f, g):
        compiled = ndd.compile(function)
        for n in (4, 2, 4):
            data = ndd.as_batch(images[:n], layout="HWC")
            assert_runs_match(run(function, data, seed=1), run(compiled, data, seed=1, warn=None))
        assert compiled.cache_info().traces == 2


def test_batch_used_only_for_its_batch_size_gives_each_calls_size():
    """A Batch argument used only for its batch size (`ndd.full(..., batch_size=x.batch_size)`):
    each call's result has that call's size, compiled and in transparent mode, from one trace
    (found by an independent differential fuzzer, ../shared/repros/fuzz/06: a later, smaller
    batch gave a result of the old size)."""
    def transparent(function, *args):
        with ndd_trace.enabled():
            result = function(*args)
            result.evaluate()
        return result

    def full(x):
        return ndd.full(np.float32(2.5), batch_size=x.batch_size, shape=[2])

    def zeros(x):
        return ndd.zeros(batch_size=x.batch_size, shape=[2])

    for function in (full, zeros):
        compiled = ndd.compile(function)
        for n in [6, 5, 2, 6]:
            x = ndd.as_batch([np.zeros((3,), np.uint8)] * n)
            eager = function(x)
            assert_same(eager, compiled(x))
            assert_same(eager, transparent(function, x))
        assert compiled.cache_info().traces == 1


# -- values equal under `==` that eager tells apart ------------------------------------------------

def _fill(x, value):
    return ndd.rotate(x, angle=45.0, fill_value=value, keep_size=True)


def _reciprocal(x, value):
    return 1.0 / (x * value)


@pytest.mark.parametrize("use", [_fill, _reciprocal], ids=["fixed argument", "arithmetic"])
def test_signed_zeros_and_nans_keep_their_bits(use, monkeypatch):
    """A NaN's sign is part of the value DALI pads with, and -0.0 after 0.0 makes 1 / (x * c)
    -inf, not inf: a compiled function called with `nan` and then `-nan` (`inf - inf`), or 0.0
    and then -0.0, must not reuse the first trace (guards), a region must not reuse the first
    pipeline (region keys), and the pipeline must build (NaN literals in the generated code)
    rather than fall back. (rotate's `fill_value` is a fixed argument; `pad`'s, a tensor
    argument, is passed as data when held in a variable, as eagerly.)

    Found in review: each once gave a silently wrong result."""
    import math

    from ndd_trace.units import cache
    monkeypatch.setattr(cache, "FREE_UNITS", 16)  # every variant compiled at its first call
    monkeypatch.setattr(cache.REGIONS, "free_units", 16)
    data = ndd.as_batch([np.zeros((4, 4, 1), np.float32)], layout="HWC")
    compiled = ndd.compile(use)
    values = [math.nan, math.inf - math.inf, math.nan, math.inf, -math.inf, -0.0, 0.0]
    ndd_trace.reset_report()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ndd_trace.NddTraceWarning)  # no eager fallback
        for value in values:
            eager = np.asarray(use(data, value).select(0).cpu()).view(np.uint32)
            traced = np.asarray(compiled(data, value).select(0).cpu()).view(np.uint32)
            with ndd_trace.enabled():
                lazy = np.asarray(use(data, value).select(0).cpu()).view(np.uint32)
            assert eager.tolist() == traced.tolist() == lazy.tolist(), value
    assert compiled.cache_info().fallbacks == 0
    if use is _fill:
        assert "fill_value=-nan" in str(ndd_trace.report())  # what tells the regions apart


def test_method_compilation(batch):
    class Augment:
        def __init__(self, size):
            self.size = size

        @ndd.compile
        def __call__(self, x):
            return ndd.resize(x, size=[self.size, self.size])

    aug = Augment(6)
    assert aug(batch).shape[0][:2] == (6, 6)
    aug.size = 7
    assert aug(batch).shape[0][:2] == (7, 7)


flip = None  # a global whose name is also an attribute the function reads (`ndd.flip`)


def test_attribute_names_are_not_guarded_as_globals(batch):
    global flip

    @ndd.compile
    def flipped(x):
        return ndd.flip(x)

    for flip in range(3):  # noqa: B007 (rebinding the global is the point)
        flipped(batch)
    flip = None
    assert flipped.cache_info().traces == 1


def test_compiled_function_used_by_another_hits_the_cache(batch):
    @ndd.compile
    def inner(x):
        return ndd.flip(x, horizontal=1)

    @ndd.compile
    def outer(x):
        return inner(x) * 2

    outer(batch)
    outer(batch)
    assert outer.cache_info().hits == 1


def test_defaults_are_bound(batch):
    @ndd.compile
    def resized(x, size=8):
        return ndd.resize(x, size=[size, size])

    resized(batch)
    resized(batch, 8)
    resized(batch, size=8)
    resized(x=batch)
    assert resized.cache_info().traces == 1


SCALE = 1


def test_generator_past_cache_limit_warns(jpeg_dir):
    """A loop body whose value changes at every epoch: past cache_limit, one warning, and
    eager's values (the new variants run in transparent mode)."""
    def loop(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            yield labels * SCALE

    def run(function):
        global SCALE
        out = []
        reader = ndd.readers.File(file_root=str(jpeg_dir))
        for scale in range(1, 5):
            SCALE = scale
            out += [np.asarray(ndd.as_tensor(x)).tolist() for x in function(reader)]
        return out

    compiled = ndd.compile(loop, cache_limit=1)
    eager = run(loop)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(compiled) == eager
    assert sum("cache_limit" in str(w.message) for w in caught) == 1
    assert compiled.cache_info().entries == 1


def test_generator_over_new_readers_traces_once(jpeg_dir):
    """The reader is not part of the loop body's key: a new reader every epoch reuses it."""
    def loop(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            yield labels

    compiled = ndd.compile(loop, cache_limit=1)
    for _ in range(3):
        list(compiled(ndd.readers.File(file_root=str(jpeg_dir))))
    assert compiled.cache_info().traces == 1


def _flipped_tensor(t):
    return ndd.flip(t) * 1


def test_tensor_copy_of_traced_tensor(images):
    """A Tensor argument (not a Batch), called twice: both calls as eager's."""
    tensor = ndd.as_tensor(images[0], layout="HWC")
    assert_matches_eager(_flipped_tensor, tensor, modes=("compiled",), calls=2)


SIZES = [10, 10]


class Scale:
    factor = 2


def test_last_call_guard_sees_in_place_changes_and_equal_values(batch):
    """The check of the last call's guards (without building its key) still re-traces on
    in-place changes (a global list, a class attribute) and on values equal under `==` but
    frozen differently (True vs 1, 0.0 vs -0.0); equal values in new objects hit the cache."""

    @ndd.compile
    def resize(x, flag):
        return ndd.resize(x, size=SIZES) * Scale.factor + flag

    def check(flag):
        assert_same(resize.__wrapped__(batch, flag), resize(batch, flag))

    check(1000)
    check(1000)
    assert resize.cache_info()[:3] == (1, 1, 1)
    SIZES[0] = 12  # the same list object, changed in place
    try:
        check(1000)
        assert resize.cache_info().traces == 2
        assert resize.last_miss_reason == "SIZES[0]: 10 -> 12"
    finally:
        SIZES[0] = 10
    Scale.factor = 3
    try:
        check(1000)
        assert resize.cache_info().traces == 3
        assert resize.last_miss_reason == "SIZES[0]: 12 -> 10; Scale.factor: 2 -> 3"
    finally:
        Scale.factor = 2
    hits = resize.cache_info().hits
    check(int("1000"))  # a new int object equal to 1000: the first entry again
    assert resize.cache_info()[:3] == (hits + 1, 3, 3)
    check(1)
    check(True)  # == 1, but another key
    check(0.0)
    check(-0.0)  # == 0.0, but another key
    assert resize.cache_info().misses == 7  # (past 4 variants, new ones run eagerly first)


def test_repeated_call_skips_building_the_key(batch, monkeypatch):
    @ndd.compile
    def flip(x, size=8):
        return ndd.flip(ndd.resize(x, size=[size, size]), horizontal=1)

    flip(batch)
    built = []
    original = ndd_trace.tracing.guards.build_key
    monkeypatch.setattr(ndd_trace.tracing.guards, "build_key",
                        lambda *args, **kwargs: built.append(1) or original(*args, **kwargs))
    assert_same(flip.__wrapped__(batch), flip(batch))
    assert_same(flip.__wrapped__(batch, 8), flip(batch, 8))
    assert not built and flip.cache_info()[:3] == (2, 1, 1)
    flip(batch, 9)
    assert built and flip.cache_info().traces == 2


def test_baked_arguments_are_keyed_by_value():
    """A per-sample function's non-Batch arguments are part of its pipeline: a Tensor by its
    data (not the object), an RNG by which generator it is."""
    plan = plans.plan_for(lambda image, value: None)
    batch = ndd.batch([np.zeros((2, 2), np.uint8)] * 3)
    first, same, other = (ndd.tensor(np.array(v, np.float32)) for v in (1.5, 1.5, 2.5))

    def key(value):
        return guards.build_key((batch, value), {}, plan, baked=True)

    assert key(first) == key(same) != key(other)
    generators = ndd.random.RNG(seed=1), ndd.random.RNG(seed=1)
    assert key(generators[0]) != key(generators[1])
    assert guards.build_key((batch, generators[0]), {}, plan) == \
        guards.build_key((batch, generators[1]), {}, plan)  # a compiled function's: fed
    assert guards.FastGuard.of((batch, first), plan, None, baked=True) is None


class _BaseSettings:
    angle = 0.0


class _Settings(_BaseSettings):
    size = 32


class _Dataset:
    size = 32

    @ndd.compile
    def load(self, x):
        return ndd.resize(x, size=[self.size, self.size])


def test_class_attributes_read_through_an_argument_are_guarded(batch):
    """`self.size` or `cfg.size` where `size` is a class attribute (not in the instance's
    __dict__): changing it on the class re-traces, as for a class read as a global (found by a
    differential sweep: the result went stale)."""

    @ndd.compile
    def resize(cfg, x):
        return ndd.rotate(ndd.resize(x, size=[cfg.size, cfg.size]), angle=cfg.angle)

    cfg, dataset = _Settings(), _Dataset()
    try:
        for size, angle in ((32, 0.0), (24, 0.0), (24, 10.0)):
            _Settings.size = _Dataset.size = size
            _BaseSettings.angle = angle  # a base class's attribute
            assert_same(resize.__wrapped__(cfg, batch), resize(cfg, batch))
            assert_same(_Dataset.load.__wrapped__(dataset, batch), dataset.load(batch))
        assert resize.cache_info().traces == 3
        assert resize.last_miss_reason == "cfg.angle: 0.0 -> 10.0"
        assert _Dataset.load.cache_info().traces == 2
    finally:
        _Settings.size = _Dataset.size = 32
        _BaseSettings.angle = 0.0


def test_changed_defaults_of_the_compiled_function_are_used_as_eager_uses_them(batch):
    def f(x, m=[2.0]):  # noqa: B006 (a mutable default, as users write them)
        return x * m[0]

    def h(x, *, s=2):
        return x * s

    compiled_f, compiled_h = ndd.compile(f), ndd.compile(h)
    for change in [lambda: None,
                   lambda: setattr(f, "__defaults__", ([4.0],)),
                   lambda: f.__defaults__[0].__setitem__(0, 3.0),
                   lambda: h.__kwdefaults__.__setitem__("s", 5),
                   lambda: setattr(h, "__kwdefaults__", {"s": 7})]:
        change()
        assert_same(f(batch), compiled_f(batch))
        assert_same(h(batch), compiled_h(batch))


def test_numpy_scalars_and_python_numbers_key_apart(batch):
    def scaled(x, k):
        return x * k

    compiled = ndd.compile(scaled)
    for k in (np.float64(3.0), 3.0, np.float32(3.0), 3, np.int64(3)):
        eager, result = scaled(batch, k), compiled(batch, k)
        assert_same(eager, result)
    assert compiled.cache_info().misses == 5  # (past 4 variants, new ones run eagerly first)


# -- recompile reasons in the user's spelling; attributes never read are not guarded ------------

class _Config:
    def __init__(self, size=48):
        self.size = size
        self.lock = threading.Lock()  # (printed by its address: another lock, another text)


CFG = _Config()


def _images(value: int) -> ndd.Batch:
    return ndd.as_batch([np.full((8, 8, 3), value, np.uint8)] * 2, layout="HWC")


def test_replacing_an_attribute_the_function_never_reads_does_not_retrace():
    """The function reads `CFG.size` only: a new `CFG.lock` (or a new CFG with the same size)
    is not a change of anything it reads; a new `CFG.size` is, and says so as written."""
    global CFG

    @ndd.compile
    def resize(x):
        return ndd.resize(x, size=[CFG.size, CFG.size])

    def check():
        assert_same(resize.__wrapped__(_images(3)), resize(_images(3)))

    saved = CFG
    try:
        check()
        CFG.lock = threading.Lock()
        check()
        CFG = _Config()
        check()
        assert resize.cache_info()[:3] == (2, 1, 1), resize.cache_info()
        CFG.size = 64
        check()
        assert resize.cache_info().traces == 2
        assert resize.last_miss_reason == "CFG.size: 48 -> 64"
    finally:
        CFG = saved


def test_a_function_that_passes_the_object_on_is_guarded_on_all_of_it():
    """`CFG` given to a helper (read bare) may be read anywhere: every attribute is guarded,
    and the reason names the one that changed."""
    global CFG

    def size_of(config):
        return config.size

    @ndd.compile
    def resize(x):
        return ndd.resize(x, size=[size_of(CFG), 8])

    saved = CFG
    try:
        assert_same(resize.__wrapped__(_images(3)), resize(_images(3)))
        CFG.lock = threading.Lock()
        assert_same(resize.__wrapped__(_images(3)), resize(_images(3)))
        assert resize.cache_info().traces == 2
        reason = resize.last_miss_reason
        assert reason.startswith("CFG.lock: <unlocked _thread.lock object at ") and \
            reason.count(" -> ") == 1, reason
    finally:
        CFG = saved


def _reason(function, before, after, *, args=(), kwargs=None, names=()):
    """The miss reason between two calls of `function`'s guards, `before()`/`after()` setting
    up each."""
    plan = plans.plan_for(function)
    before()
    old = guards.build_key(args() if callable(args) else args, kwargs or {}, plan, names=names)
    after()
    new = guards.build_key(args() if callable(args) else args, kwargs or {}, plan, names=names)
    return ndd_trace.core.keys.explain_miss(new, old)


SCALE = 0.5
OPTIONS = {"size": 3, "mode": "linear"}


def _helper(x, k=1, *, bias=0.0):
    return x * k + bias


def test_recompile_reasons_spell_what_the_user_wrote(monkeypatch):
    """Each kind of guard's change, named as written: a global, a dict item, a list item, a
    helper's defaults, `*args` and `**kwargs` items, a Batch argument's dtype and an array's
    shape."""
    def uses_globals(x):
        return x * SCALE + OPTIONS["size"] + _helper(x)

    def set_(name, value):
        return lambda: monkeypatch.setitem(globals(), name, value)

    assert _reason(uses_globals, set_("SCALE", 0.5), set_("SCALE", 0.25)) == "SCALE: 0.5 -> 0.25"
    assert _reason(uses_globals, set_("OPTIONS", {"size": 3, "mode": "linear"}),
                   set_("OPTIONS", {"size": 4, "mode": "linear"})) == "OPTIONS['size']: 3 -> 4"
    assert _reason(uses_globals, lambda: None, lambda: OPTIONS.update(extra=1)) == \
        "OPTIONS['extra']: (not set) -> 1"
    monkeypatch.setattr(_helper, "__defaults__", (1,))
    assert _reason(uses_globals, lambda: None,
                   lambda: monkeypatch.setattr(_helper, "__defaults__", (2,))) == \
        "_helper.__defaults__[0]: 1 -> 2"
    assert _reason(uses_globals, lambda: None,
                   lambda: monkeypatch.setattr(_helper, "__kwdefaults__", {"bias": 1.0})) == \
        "_helper.__kwdefaults__['bias']: 0.0 -> 1.0"

    def variadic(x, *args, scale=1, **kwargs):
        return x

    arrays = [np.zeros(3, np.float32), np.zeros(3, np.float32)]
    assert _reason(variadic, lambda: None, lambda: arrays.__setitem__(1, np.zeros(4, np.float32)),
                   args=lambda: (1, *arrays), names=("x",)) == "args[1].shape: (3,) -> (4,)"
    assert _reason(variadic, lambda: None, lambda: arrays.__setitem__(0, np.ones(3, np.float32)),
                   args=lambda: (1, *arrays), names=("x",)).startswith(
        "args[0]: other values of the same dtype and shape (ndarray(float32, shape=(3,))")
    options = {"size": 3, "scale": 2}
    assert _reason(variadic, lambda: None, lambda: options.update(size=4, scale=3),
                   args=(1,), kwargs=options, names=("x",)) == \
        "scale: 2 -> 3; kwargs['size']: 3 -> 4"
    images = [_images(1)]
    assert _reason(lambda images: images, lambda: None,
                   lambda: images.__setitem__(0, ndd.as_batch(
                       [np.zeros((8, 8, 3), np.float32)] * 2, layout="HWC")),
                   args=lambda: (images[0],)) == "images.dtype: UINT8 -> FLOAT"


def test_miss_reasons_read_alike_everywhere(caplog):
    """`last_miss_reason`, explain's, the `recompiles` log line and the cache_limit warning
    print the same text (one printer)."""
    import logging

    @ndd.compile(cache_limit=2)
    def resize(x):
        return ndd.resize(x, size=[CFG.size, CFG.size])

    saved = CFG.size
    try:
        with caplog.at_level(logging.INFO, logger="ndd_trace.recompiles"), \
                warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for size in (48, 56, 64):
                CFG.size = size
                assert_same(resize.__wrapped__(_images(3)), resize(_images(3)))
        assert resize.last_miss_reason == "CFG.size: 56 -> 64"
        assert ndd_trace.explain(resize, _images(3)).miss_reason == "CFG.size: 56 -> 64"
        assert "CFG.size == 64" in ndd_trace.explain(resize, _images(3)).guards
        logged = [r.getMessage() for r in caplog.records if r.name == "ndd_trace.recompiles"]
        assert logged and logged[0].endswith(": CFG.size: 48 -> 56"), logged
        (limit,) = [str(w.message) for w in record if "cache_limit" in str(w.message)]
        assert "last change: CFG.size: 56 -> 64." in limit
    finally:
        CFG.size = saved


class _Augment:
    """A dataset-like object whose compiled method reads `self.size` only."""

    def __init__(self):
        self.size = 8
        self.epoch = 0  # bumped by the training loop: no attribute the step reads
        self.options = {"angle": 10.0}

    @ndd.compile
    def step(self, x):
        return ndd.rotate(ndd.resize(x, size=[self.size, self.size]),
                          angle=self.options["angle"])

    @property
    def drawn(self):  # reading it would run the user's code (and move their generator)
        return np.random.uniform()


def test_self_and_closure_objects_are_keyed_by_the_attributes_read():
    """A compiled method reading `self.size` and `self.options[...]` does not re-trace when
    the loop bumps `self.epoch`; a change of `self.options` names the item; a closure
    variable read as `cfg.size` likewise; a property (code) is read by no guard."""
    augment = _Augment()

    def check():
        assert_same(_Augment.step.__wrapped__(augment, _images(3)), augment.step(_images(3)))

    check()
    augment.epoch += 1
    check()
    assert _Augment.step.cache_info()[:3] == (1, 1, 1)
    augment.options["angle"] = 20.0
    check()
    assert _Augment.step.last_miss_reason == "self.options['angle']: 10.0 -> 20.0"
    cfg = _Config(8)

    @ndd.compile
    def resize(x):
        return ndd.resize(x, size=[cfg.size, cfg.size])

    resize(_images(3)).evaluate()
    cfg.lock = threading.Lock()
    resize(_images(3)).evaluate()
    assert resize.cache_info().traces == 1
    plan = plans.plan_for(lambda x: augment.drawn + x)  # (augment: a closure variable)
    state = np.random.get_state()[1].copy()
    key = guards.build_key((1,), {}, plan)
    assert np.array_equal(np.random.get_state()[1], state)  # the property did not run
    # keyed by the getter (its code) and what the getter reads of `self` (nothing), not run
    keyed = dict(key)
    assert "drawn() reads np" in keyed and list(keyed)[-1] == "augment.drawn", list(keyed)
    assert keyed["augment.drawn"] == guards.freeze(type(augment).drawn.fget, guards.GUARDS)


# -- what a function reads, changed between calls (a new-user probe: each was silently stale) ---

class _Slotted:
    __slots__ = ("k", "__gain")

    def __init__(self, k):
        self.k = k
        self.__gain = 1.0

    def run(self, x):
        return x * self.k * self.__gain

    def set_gain(self, gain):
        self.__gain = gain


@dataclasses.dataclass(slots=True)
class _SlottedSettings:
    offset: float = 1.0


SLOTTED_RUN = None


def test_objects_with_slots_are_guarded_by_their_attributes(batch):
    """A `__slots__` object (a global's bound method, an argument; private slots too) and a
    `@dataclass(slots=True)`, changed in place between calls, re-trace."""
    global SLOTTED_RUN
    owner, settings = _Slotted(2.0), _SlottedSettings()
    SLOTTED_RUN = owner.run

    def call(x, settings):
        return SLOTTED_RUN(x) + settings.offset

    compiled = assert_each_matches_eager(call, batch, settings, changes=[
        lambda: None, lambda: setattr(owner, "k", 3.0), lambda: owner.set_gain(0.5),
        lambda: setattr(settings, "offset", 4.0), lambda: None], warn=None)
    assert compiled.cache_info().traces == 4


class _Normalizer:
    mean = np.array([1.0, 2.0, 3.0], np.float32)
    scale = np.float32(2.0)
    mode = None

    def apply(self, x):
        return (ndd.cast(x, dtype=ndd.float32) - self.mean) * self.scale


class _Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


def test_class_attributes_of_every_kind_and_methods_replaced_are_guarded(batch):
    """Class attributes holding numpy values (rebound or written in place), enums or user
    objects, and a method replaced on the class, re-trace."""
    normalizer = _Normalizer()
    saved = dict(vars(_Normalizer))

    def call(x):
        y = normalizer.apply(x)
        return ndd.flip(y, horizontal=1) if _Normalizer.mode is _Mode.TRAIN else y

    try:
        compiled = assert_each_matches_eager(call, batch, changes=[
            lambda: None, lambda: _Normalizer.mean.__setitem__(0, 5.0),
            lambda: setattr(_Normalizer, "scale", np.float32(3.0)),
            lambda: setattr(_Normalizer, "mode", _Mode.TRAIN),
            lambda: setattr(_Normalizer, "apply", lambda self, x: x * self.scale),
            lambda: None], warn=None)
        assert compiled.cache_info().traces == 5
    finally:
        for name in ("mean", "scale", "mode", "apply"):
            setattr(_Normalizer, name, saved[name])
        _Normalizer.mean[0] = 1.0


def _augment(x):
    return x * 2


def _edited(x):
    return x * 3


def test_a_helper_whose_code_is_reloaded_retraces(batch):
    """A helper's `__code__` replaced in place (IPython's autoreload, after the user edits its
    file) re-traces."""
    saved = _augment.__code__

    def call(x):
        return _augment(x)

    try:
        compiled = assert_each_matches_eager(call, batch, changes=[
            lambda: None, lambda: setattr(_augment, "__code__", _edited.__code__),
            lambda: None], warn=None)
        assert compiled.cache_info().traces == 2
    finally:
        _augment.__code__ = saved


WRAPPER_GAIN = 2.0


def _scaled(function):
    @functools.wraps(function)
    def wrapper(x):
        return function(x) * WRAPPER_GAIN
    return wrapper


@_scaled
def _flipped(x):
    return ndd.flip(x, horizontal=1)


def _set_wrapper_gain(gain):
    def change():
        global WRAPPER_GAIN
        WRAPPER_GAIN = gain
    return change


def test_what_a_users_wraps_decorator_reads_is_guarded(batch):
    """The user's own `functools.wraps` decorator, on a helper or on the compiled function,
    whose wrapper reads a global: a change re-traces (the guards looked behind `__wrapped__`
    only)."""
    def call(x):
        return _flipped(x)

    for function in (call, _flipped):
        compiled = assert_each_matches_eager(function, batch, changes=[
            _set_wrapper_gain(2.0), _set_wrapper_gain(3.0), lambda: None], warn=None)
        assert compiled.cache_info().traces == 2


def _user_modules(tmp_path, monkeypatch, prefix):
    """A settings module and a transforms module reading it, as a user's project has them."""
    (tmp_path / f"{prefix}_settings.py").write_text("SIZE = 8\nGAIN = 2.0\n")
    (tmp_path / f"{prefix}_transforms.py").write_text(textwrap.dedent(f"""\
        import nvidia.dali.experimental.dynamic as ndd
        import {prefix}_settings as settings


        def resize(x):
            return ndd.resize(x, size=[settings.SIZE, settings.SIZE])
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return (importlib.import_module(f"{prefix}_settings"),
            importlib.import_module(f"{prefix}_transforms"))


def test_modules_imported_inside_the_function_are_guarded(batch, tmp_path, monkeypatch):
    """`import settings` or `from settings import GAIN` in the function's own body: what it
    reads of them is guarded (at every call, through `sys.modules`)."""
    settings, _ = _user_modules(tmp_path, monkeypatch, "imports_guarded")

    def call(x):
        import imports_guarded_settings as config
        from imports_guarded_settings import GAIN
        return ndd.resize(x, size=[config.SIZE, config.SIZE]) * GAIN

    compiled = assert_each_matches_eager(call, batch, changes=[
        lambda: None, lambda: setattr(settings, "SIZE", 6), lambda: setattr(settings, "GAIN", 3.0),
        lambda: None], warn=None)
    assert compiled.cache_info().traces == 3


def test_helpers_of_the_users_modules_are_guarded(batch, tmp_path, monkeypatch):
    """`transforms.resize(x)`, a helper of the user's module reading another module's value
    (progressive resizing: `settings.SIZE` changed between epochs), re-traces."""
    settings, transforms = _user_modules(tmp_path, monkeypatch, "helpers_guarded")

    def call(x):
        return transforms.resize(x)

    compiled = assert_each_matches_eager(call, batch, changes=[
        lambda: None, lambda: setattr(settings, "SIZE", 6), lambda: None], warn=None)
    assert compiled.cache_info().traces == 2


OBJECT_GAIN = 2.0


class _Augmenter:
    def __init__(self):
        self.k = OBJECT_GAIN

    def run(self, x):
        return x * OBJECT_GAIN

    def __call__(self, x):
        return x * OBJECT_GAIN

    @property
    def gain(self):
        return OBJECT_GAIN


AUGMENTER = _Augmenter()
AUGMENTER_STEP = AUGMENTER.run


def _set_object_gain(gain):
    def change():
        global OBJECT_GAIN
        OBJECT_GAIN = gain
    return change


@pytest.mark.parametrize("use", ["bound method", "method", "call", "property", "class"])
def test_what_code_reached_through_a_global_object_reads_is_guarded(batch, use):
    """A global read by a method of a global object (bound, called on it, its `__call__`), a
    property's getter, or the `__init__` of a class the function makes: a change re-traces."""
    def call(x):
        if use == "bound method":
            return AUGMENTER_STEP(x)
        if use == "method":
            return AUGMENTER.run(x)
        if use == "call":
            return AUGMENTER(x)
        return x * (AUGMENTER.gain if use == "property" else _Augmenter().k)

    compiled = assert_each_matches_eager(call, batch, changes=[
        _set_object_gain(2.0), _set_object_gain(3.0), lambda: None], warn=None)
    assert compiled.cache_info().traces == 2


class _Gain:
    def __init__(self, gain):
        self.gain = gain
        self.calls = 0

    def apply(self, x):
        return x * self.gain

    def __call__(self, x):
        return ndd.flip(x, horizontal=1) * self.gain


def _bound_method_and_object_changed(wrap, x):
    scaler = _Gain(2)
    method, called = wrap(scaler.apply), wrap(scaler)
    before = [method(x), called(x)]
    scaler.gain = 5  # the object the compiled method and object hold, changed between calls
    return before, [method(x), called(x)]


def test_a_compiled_bound_method_and_callable_object_are_keyed_by_their_object(batch):
    """`ndd.compile(obj.method)` and `ndd.compile(obj)` (an object with `__call__`): the object
    is read as an argument is (found by a new-user probe: the first compiled the method with
    its object unguarded, stale results; the second raised AttributeError)."""
    assert_matches_eager(_bound_method_and_object_changed, Compiler(), batch, modes=("step",))


_FACTOR = 2


@functools.lru_cache(maxsize=None)
def _factor_for(n):
    return _FACTOR * n


def _scaled_by_a_cached_factor(x):
    return x * _factor_for(1)


def _factor_changed_then_cleared(step, x):
    global _FACTOR
    _FACTOR = 2
    _factor_for.cache_clear()
    first = step(x)
    _FACTOR = 3
    stale = step(x)  # the lru cache still answers 2, eagerly too
    _factor_for.cache_clear()
    return first, stale, step(x)


def test_an_lru_cache_helper_is_keyed_by_what_it_reads_and_holds(batch):
    """Found by a new-user probe: after `cache_clear()` eager recomputes from the global it
    reads; the compiled function kept its variant."""
    assert_matches_eager(_factor_changed_then_cleared, Step(_scaled_by_a_cached_factor), batch,
                         modes=("step",))


def _blend_or_pass(batches, k):
    a, b = batches
    if a is b:  # the same batch twice: passed through
        return a
    return ndd.cast(a, dtype=ndd.float32) * k + ndd.cast(b, dtype=ndd.float32)


def _calls_with_arguments_aliased_or_not(step):
    x = ndd.as_batch([np.full((2, 2, 1), 10, np.uint8)] * 2, layout="HWC")
    y = ndd.as_batch([np.full((2, 2, 1), 20, np.uint8)] * 2, layout="HWC")
    results = [step((x, y), 2), step((x, x), 2), step([y, x], 2), step([y, y], 3), step((x, y), 2)]
    return results, [result is x or result is y for result in results]


def _blend_two(a, b):
    return _blend_or_pass((a, b), 2)


def _calls_with_two_arguments(step):
    x = ndd.as_batch([np.full((2, 2, 1), 10, np.uint8)] * 2, layout="HWC")
    y = ndd.as_batch([np.full((2, 2, 1), 20, np.uint8)] * 2, layout="HWC")
    results = [step(x, y), step(x, x), step(x, y), step(y, y)]  # (the fast guard's path)
    return results, [result is x or result is y for result in results]


def test_arguments_that_are_the_same_object_are_keyed_as_such():
    """Found by the twenty-seventh session's sweep: `a is b` on two arguments (or two items of
    one) read the trace's two proxies; a call given one batch twice reused the variant traced
    for two. Now one object is one proxy, and which data arguments are the same object is in
    the key and checked by the fast guard."""
    assert_matches_eager(_calls_with_arguments_aliased_or_not, Step(_blend_or_pass),
                         modes=("step",))
    assert_matches_eager(_calls_with_arguments_aliased_or_not,
                         Step(lambda batches, k: _blend_or_pass(batches, k)), modes=("step",))
    assert_matches_eager(_calls_with_two_arguments, Step(_blend_two), modes=("step",))
    x = ndd.as_batch([np.zeros((2, 2, 1), np.uint8)] * 2, layout="HWC")
    assert aliasing.data_aliasing([x, (x, 1)]) == (0, 0)
    assert aliasing.data_aliasing([x, ndd.as_batch([np.zeros((1,), np.uint8)])]) is None


# Found by the twenty-eighth session's sweep of new-user programs: a hit replayed a trace whose
# Python had iterated an argument in another order.

def _apply_in_keyword_order(x, **ops):
    for name, value in ops.items():
        x = x * value if name == "mul" else x + value
    return x, list(ops)


def _both_keyword_orders(x, step):
    return step(x, mul=2.0, add=1.0), step(x, add=1.0, mul=2.0)


def _iterate_the_plan(x, plan):
    for k in plan:
        x = x * 2 if k == 0 else x + 1
    return x, list(plan)


def _two_orders_of_one_set(x, step):
    first, second = set(), set()
    first.add(0), first.add(8)
    second.add(8), second.add(0)  # (equal sets: `8` and `0` collide, so the order is the adds')
    assert first == second and list(first) != list(second)
    return step(x, first), step(x, second), step(x, frozenset(second))


@pytest.mark.parametrize("scenario, function", [
    (_both_keyword_orders, _apply_in_keyword_order),
    (_two_orders_of_one_set, _iterate_the_plan)], ids=["kwargs", "set"])
def test_the_order_an_argument_iterates_in_is_part_of_the_key(scenario, function):
    """`**kwargs` items and a set's items, iterated by the function's Python: a call that gives
    them in another order is another variant (its key says so), as eager's loop sees them."""
    x = ndd.as_batch([np.ones((2,), np.float32)])
    runs = assert_matches_eager(scenario, x, Step(function), modes=("step",))
    assert runs["step"].steps[0].cache_info().traces >= 2
