"""The DALI surface ndd_trace relies on: every private DALI module, name and attribute, each with
the reason it is used, checked against the installed DALI. This is the upgrade checklist: when
DALI changes, the failing entries say what to look at, and only ndd_trace/_dali/ (the
adapter) has to change.

Two rules are checked on the source: every private name the adapter (`ndd_trace/_dali/`) touches is
listed here (a new one gets a line and a reason), and no other module of the package touches a DALI
private (they go through the adapter's functions).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os

import pytest

import nvidia.dali.experimental.dynamic as ndd

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ndd_trace")

# owner -> how to find it in the installed DALI
OWNERS = {
    "ndd": "nvidia.dali.experimental.dynamic",
    "_ops": "nvidia.dali.experimental.dynamic._ops",
    "_op_builder": "nvidia.dali.experimental.dynamic._op_builder",
    "_call_site": "nvidia.dali.experimental.dynamic._call_site",
    "_invocation": "nvidia.dali.experimental.dynamic._invocation",
    "_tensor": "nvidia.dali.experimental.dynamic._tensor",
    "_capture": "nvidia.dali.experimental.dynamic._capture",
    "_eval_context": "nvidia.dali.experimental.dynamic._eval_context",
    "_eval_mode": "nvidia.dali.experimental.dynamic._eval_mode",
    "_source_analysis": "nvidia.dali.experimental.dynamic._source_analysis",
    "_exceptions": "nvidia.dali.experimental.dynamic._exceptions",
    "random": "nvidia.dali.experimental.dynamic.random",
    "_conditionals": "nvidia.dali._conditionals",
    "tf_stack": "nvidia.dali._autograph.utils.tf_stack",
    "types": "nvidia.dali.types",
    "fn": "nvidia.dali.fn",
    "ops": "nvidia.dali.ops",
    "Operator": "nvidia.dali.experimental.dynamic._ops:Operator",
    "Reader": "nvidia.dali.experimental.dynamic._ops:Reader",
    "Batch": "nvidia.dali.experimental.dynamic:Batch",
    "Tensor": "nvidia.dali.experimental.dynamic:Tensor",
    "RNG": "nvidia.dali.experimental.dynamic.random:RNG",
    "ExternalSource": "nvidia.dali.experimental.dynamic:ExternalSource",
    "EvalContext": "nvidia.dali.experimental.dynamic._eval_context:EvalContext",
    "CaptureContext": "nvidia.dali.experimental.dynamic._capture:CaptureContext",
    "Pipeline": "nvidia.dali.pipeline:Pipeline",
    "DataNode": "nvidia.dali.data_node:DataNode",
    "dali": "nvidia.dali",
    "OperatorInstance": "nvidia.dali.ops:_OperatorInstance",
    "ConditionStack": "nvidia.dali._conditionals:_ConditionStack",
    "op class": "nvidia.dali.experimental.dynamic:resize._op_class",
    "TensorListCPU": "nvidia.dali.backend:TensorListCPU",
    "TensorListGPU": "nvidia.dali.backend:TensorListGPU",
}

# (owner, private name): why ndd_trace needs it. `owner.name` must exist in the installed DALI
# (a class attribute, a module global, or an instance field its class's source assigns).
SURFACE = {
    # private modules
    ("ndd", "_call_site"): "eager's call-site resolution: the user's frame an op call came from",
    ("ndd", "_tensor"): "ndd's conversion of data to a Tensor (asks_as_python_data)",
    ("_tensor", "_get_array_interface"): "where ndd reads a value's __array__: the batch size "
                                         "given as data made a 32-bit int, as eager makes one",
    ("ndd", "_invocation"): "the op call's recorded stack (call_stacks_start_above)",
    ("_invocation", "capture_stack_from_frame"): "the stack eager records at an op call: "
                                                 "the launcher's frames left out",
    ("_invocation", "Invocation"): "an op call, whose operator instance goes back to the "
                                   "EvalContext's cache when it is freed: the calls a raised "
                                   "error holds (invocations_held_by)",
    ("ndd", "_capture"): "DALI's capture mode: stepping aside while it records or replays",
    ("ndd", "_eval_context"): "the current EvalContext: its instance cache",
    ("ndd", "_eval_mode"): "the EvalModes entered on this thread",
    ("ndd", "_op_builder"): "ndd's backend resolution and argument decay",
    ("ndd", "_ops"): "Operator, Reader, the op classes and ndd's data conversions",
    ("ndd", "_source_analysis"): "eager's constant-argument analysis of a call site",
    ("ndd", "_exceptions"): "eager's text for an error met at first use (rethrow_exception)",
    ("ndd", "_tensor_subscript"): "`tensor[...]` of a traced Tensor, recorded as ndd records it",
    ("_exceptions", "rethrow_exception"): "eager's text for an error met at first use",
    # operator classes (made by _op_builder from the schemas)
    ("Operator", "_schema"): "the op's schema: argument kinds, backends",
    ("Operator", "_schema_name"): "the schema's name (PerFrame's layout, error messages)",
    ("Operator", "_legacy_op"): "the pipeline-mode op: metadata inference without running",
    ("op class", "_fn_path"): "`fn.<path>` of the op, written into generated pipelines",
    ("Operator", "_op_name"): "a reader's class name, for its pipeline-mode path",
    ("Operator", "_is_stateful"): "stateful ops are graph breaks",
    ("Operator", "_has_random_state_arg"): "random ops get their Philox state fed",
    ("op class", "_argument_conversion_map"): "the dtype ndd converts a tensor argument to",
    ("Operator", "_input_device"): "where ndd copies an input before the op",
    ("Operator", "_supported_backends"): "whether an op has a mixed (GPU decoder) backend",
    ("Operator", "_process_params"): "a recorded call replayed as ndd's function makes it "
                                     "(call_split); replaced by a test's spy",
    ("Operator", "_get"): "the instance eager's cache holds for a replayed call (call_split)",
    ("Operator", "_cache"): "eager's instance cache an instance belongs to (transparent mode "
                            "leaves the instances eager calls leave)",
    ("Operator", "_key"): "the instance's key in that cache",
    ("Operator", "_init_args"): "a reader's construction arguments (its pipeline-mode op)",
    ("Operator", "_name"): "a reader's instance name (its operator's name in a pipeline)",
    ("Operator", "_max_batch_size"): "a reader's batch size, checked as eager checks it",
    ("Operator", "_op_backend"): "a reader's C++ operator, moved into its stream's pipeline",
    ("Operator", "_init_backend"): "a reader's operator made as eager makes it",
    ("Operator", "_op_spec"): "a reader's op spec, made again for a stream's operator that "
                              "reads files into memory (dont_use_mmap)",
    ("_ops", "_all_ops"): "every op class, whose __call__ the interceptor hooks",
    ("_ops", "_to_batch"): "ndd's conversion of a value to a Batch",
    ("_ops", "_to_tensor"): "ndd's conversion of a value to a Tensor",
    ("_ops", "_shard_size"): "a shard's size, as next_epoch counts its batches",
    ("_op_builder", "_resolve_backend"): "the device and backend of an op call, as ndd resolves "
                                         "them",
    ("_op_builder", "_scalar_decay"): "ndd's decay of DType/Device arguments",
    ("_op_builder", "_unsupported_args"): "arguments ndd's functions do not take",
    ("_op_builder", "_next_pow2"): "the max batch size in eager's instance keys",
    ("_op_builder", "_check_batch_size_available"): "eager's check of a replayed call "
                                                    "(call_split)",
    ("_ops", "_infer_batch_size"): "a replayed call's batch size, as ndd infers it (call_split)",
    ("_call_site", "resolve_callsite_frame"): "the frame eager analyses for a call",
    ("_call_site", "mark_transparent"): "hooks marked as plumbing: call sites resolve past them",
    ("_source_analysis", "constant_kwargs"): "which keyword arguments a call site shows constant",
    ("_source_analysis", "_get_module_info"): "DALI's parse of a module (the warm-start cache)",
    ("_source_analysis", "_file_cache"): "DALI's per-file parses: a saved one is put there",
    ("_source_analysis", "ModuleInfo"): "what a saved parse must be to be used",
    ("_source_analysis", "cst"): "libcst as DALI imports it (its version, where vendored)",
    ("EvalContext", "_instance_cache"): "eager's operator instances, per context",
    # readers
    ("Reader", "_batches"): "eager's batch epoch: raises eager's own errors for a bad batch size",
    ("Reader", "_advance_shard"): "the shard an epoch ends on",
    ("Reader", "_capture_mode"): "readers in DALI's capture mode stay DALI's",
    ("Reader", "_check_not_disabled"): "eager's check of a disabled reader",
    ("Reader", "_checkpointing_enabled"): "checkpointing readers are read eagerly",
    ("Reader", "_get_batch_size"): "an epoch's batch size, as next_epoch picks it",
    ("Reader", "_num_shards"): "shards, as next_epoch counts them",
    ("Reader", "_shard_id"): "shards, as next_epoch counts them",
    ("Reader", "_process_tensor_args"): "a reader's tensor arguments for its operator",
    ("Reader", "_raw_tensor_args"): "readers with tensor arguments are read eagerly",
    ("Reader", "_require_api_type"): "eager's 'Cannot mix samples, batches' check",
    ("Reader", "_transferred"): "a reader whose operator moved into a pipeline",
    ("Reader", "_enable_checkpointing"): "ndd_trace.nodes.Loop makes its readers checkpoint",
    ("Reader", "_shard_epoch_size"): "an epoch's batches, as eager's next_epoch counts them",
    # external sources
    ("ExternalSource", "_callback"): "one item of a source, pulled as `source()` pulls it",
    ("ExternalSource", "_convert_outputs"): "an item converted as `source()` converts it",
    # random generators
    ("random", "_STATE_WORDS"): "the words of one random op call's Philox state",
    ("random", "_draw_state"): "a random op's state, drawn as eager draws it",
    ("random", "_resolve_rng"): "the generator a random op call uses",
    ("random", "_thread_local"): "whether this thread has a default generator yet",
    ("RNG", "_draws"): "a generator's position (draws so far)",
    ("RNG", "_version"): "a generator's position (reseeds)",
    ("RNG", "_rng"): "drawing a whole state in one go (the Philox engine)",
    ("RNG", "_on_draw"): "what each draw does first (capture mode's hook)",
    ("RNG", "_pending_draws"): "draws ndd has yet to apply",
    ("RNG", "_flush_pending"): "applying them",
    # data objects
    ("Batch", "_storage"): "a Batch's TensorList",
    ("Batch", "_is_external"): "whether eager reads a Batch as user data (runs its op at once)",
    ("Batch", "_invocation_result"): "a lazy Batch built on ndd_trace's result (transparent "
                                     "mode's values: the recorded output it stands for)",
    ("Tensor", "_invocation_result"): "a lazy Tensor built on ndd_trace's result (transparent "
                                      "mode's values: the recorded output it stands for)",
    ("Batch", "_wraps_external_data"): "the fields of a Batch made without its constructor",
    ("Batch", "_tensors"): "the fields of a Batch made without its constructor",
    ("Batch", "_dtype"): "the fields of a Batch made without its constructor",
    ("Batch", "_device"): "the fields of a Batch made without its constructor",
    ("Batch", "_layout"): "the fields of a Batch made without its constructor",
    ("Batch", "_ndim"): "the fields of a Batch made without its constructor",
    ("TensorListCPU", "_make_copy"): "a DALI-owned copy of user data (kept alive by DALI)",
    ("TensorListGPU", "_set_stream"): "a coalesced call's view of its run's output keeps the "
                                      "stream that output is ordered on",
    # pipelines
    ("Pipeline", "_transfer_operator"): "a reader's operator moved into its stream's pipeline",
    ("Pipeline", "_pipe"): "feeding and running without the per-call checks (hot path)",
    ("Pipeline", "_batches_to_consume"): "scheduling one iteration at a time",
    ("Pipeline", "_consumer_iter"): "fetching one iteration at a time",
    ("Pipeline", "_exec_async"): "whether one iteration can be scheduled so",
    ("Pipeline", "_input_callbacks"): "whether one iteration can be scheduled so",
    ("Pipeline", "_run_once"): "scheduling one iteration otherwise",
    ("Pipeline", "_feed_input"): "feeding data that is not a TensorList",
    ("Pipeline", "_pipes"): "pipelines DALI shuts down at exit (a failed one is set aside)",
    ("types", "_raw_cuda_stream_ptr"): "the stream of a GPU TensorList fed to a pipeline",
    ("fn", "_to_snake_case"): "a reader's pipeline-mode path",
    # capture mode and conditionals
    ("CaptureContext", "_tls"): "whether DALI's capture mode runs a loop body on this thread",
    ("_eval_mode", "_tls"): "whether `with ndd.EvalMode.eager:` is entered (not just the "
                            "default): transparent mode starts its calls at once",
    ("_conditionals", "_OVERLOADS"): "DALI's AutoGraph `not`/`and`/`or`, watched while a "
                                     "per-sample pipeline is defined",
    ("_conditionals", "_Branch"): "which branch of a per-sample `if` a definition is in",
    ("tf_stack", "_source_mapper_stacks"): "the user's line of AutoGraph-generated code",
    ("dali", "_conditionals"): "DALI's conditionals (its AutoGraph fork): per-sample functions",
    ("OperatorInstance", "_inputs"): "the value behind a conditional's split; the inputs of an "
                                     "op a per-sample definition made (recorded as the IR)",
    ("ops", "_OperatorInstance"): "every op a per-sample pipeline definition makes, reported as "
                                  "it is made (its __init__ wrapped while one is defined)",
    ("OperatorInstance", "_op"): "the op of a DataNode's source (a conditional's split?)",
    ("ConditionStack", "_stack"): "the branches a per-sample definition is inside",
}

# private names used as strings (dictionary keys, attribute names built at run time)
STRINGS = {
    "_func_impl_": "the implementation each generated op function calls (the interceptor "
                   "swaps it)",
    "_generated": "marks ndd's generated op functions",
    "_op_class": "an op function's operator class",
    "_process_params": "(see Operator._process_params)",
    "_random_state": "a random op's state argument",
    "_backend": "ndd's internal backend argument",
    "_caller_frame": "ndd's internal call-site argument",
    "_conditional__Split": "DALI's conditional split op (seen through)",
    "_conditional__ValidateLogical": "DALI's `and`/`or` operand check op (seen through)",
    "_conditional.split": "DALI's conditional split op (a coalesced run's slices)",
    "_conditional.merge": "DALI's conditional merge op (a coalesced run's slices)",
    "_conditional__Merge": "DALI's conditional merge op's schema",
}


def _resolve(owner: str) -> object:
    module, _, attributes = OWNERS[owner].partition(":")
    value = importlib.import_module(module)
    for attribute in filter(None, attributes.split(".")):
        value = getattr(value, attribute)
    return value


def _exists(owner: object, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if inspect.isclass(owner):  # an instance field that its class's module (or a base's) sets
        for cls in owner.__mro__:
            try:
                source = inspect.getsource(inspect.getmodule(cls))
            except (OSError, TypeError):
                continue
            if f".{name} =" in source or f"self.{name}:" in source:
                return True
    return False


@pytest.mark.parametrize("owner, name", sorted(SURFACE), ids=lambda x: str(x))
def test_each_private_dali_name_exists(owner, name):
    assert _exists(_resolve(owner), name), (
        f"DALI no longer has {owner}.{name}, which ndd_trace uses for: "
        f"{SURFACE[(owner, name)]}")


def _private_attributes(path: str) -> set[str]:
    """Private attribute names read or written in a module, but on `self`/`cls`."""
    with open(path) as file:
        tree = ast.parse(file.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            base = ast.unparse(node.value)
            if base not in ("self", "cls") and not node.attr.startswith("_ndd_trace"):
                names.add(node.attr)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nvidia"):
            names.update(alias.name for alias in node.names if alias.name.startswith("_"))
    return names


ADAPTER = os.path.join(PACKAGE, "_dali")


def _package_files(adapter: bool) -> list[str]:
    """The adapter's files (ndd_trace/_dali/*.py), or every other file of the package."""
    found = []
    for directory, _, files in os.walk(PACKAGE):
        inside = os.path.commonpath([directory, ADAPTER]) == ADAPTER
        found += [os.path.join(directory, f) for f in files if f.endswith(".py")
                  and inside == adapter]
    return sorted(found)


def _adapter_own_names() -> set[str]:
    """The adapter's own private names (its module-level helpers and its classes' fields)."""
    own = set()
    for path in _package_files(adapter=True):
        with open(path) as file:
            own |= _own_names(ast.parse(file.read()))
    return own


def _own_names(tree: ast.Module) -> set[str]:
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("_"):
            own.add(node.name)
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self":
            own.add(node.attr)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    return own


def test_every_private_name_the_adapter_uses_is_listed():
    listed = {name for _, name in SURFACE} | set(STRINGS)
    used = set().union(*map(_private_attributes, _package_files(adapter=True)))
    used -= _adapter_own_names()
    assert not used - listed, (
        f"ndd_trace/_dali/ uses private DALI names not listed in {__file__}: "
        f"{sorted(used - listed)}; add each with its reason")


def test_no_other_module_touches_a_dali_private():
    """Attributes named as DALI's private fields, read or written outside the adapter."""
    dali_fields = {name for owner, name in SURFACE if owner not in ("ndd",)}
    offenders = {}
    for path in _package_files(adapter=False):
        touched = _private_attributes(path) & dali_fields
        if touched:
            offenders[os.path.relpath(path, PACKAGE)] = sorted(touched)
    assert not offenders, f"DALI privates outside ndd_trace/_dali/: {offenders}"


def test_the_walk_sees_the_whole_package():
    adapter, others = _package_files(adapter=True), _package_files(adapter=False)
    assert len(adapter) >= 8 and any(p.endswith(os.path.join("modes", "lazy.py")) for p in others)


def test_the_checklist_names_dali_version():
    import ndd_trace

    assert ndd_trace._dali.DALI_VERSION.startswith("2.4"), (
        "ndd_trace is tested with nvidia-dali-cuda120 2.4.x: re-run this file's checks on a "
        "new version, and update pyproject.toml's pin")
    assert ndd.Batch is ndd_trace._dali.Batch
