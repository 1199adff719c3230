"""The adapter: the one package that touches DALI internals; a DALI upgrade is its work alone.

    for function in op_functions():            # every ndd operator function (ndd.resize, ...)
        ...
    with intercept(handler):                   # ndd calls go to handler(op, args, kwargs)
        ...
    meta = infer_metadata(op_class, "cpu", static, input_metas, arg_metas)

Tested with nvidia-dali-cuda120 2.4.x. What it relies on (private, may change between releases):
makefun-generated operator functions that call `_func_impl_` from their own globals;
`Operator._legacy_op`, `_schema`, `_has_random_state_arg`, `_is_stateful`,
`_argument_conversion_map`, `_input_device`; `_op_builder._resolve_backend`, `_scalar_decay`,
`_unsupported_args`, `_next_pow2` and `_check_batch_size_available`; `Operator._process_params`
and `Operator._get` (a recorded call replayed as ndd's function makes it: `call_split`);
`_ops._infer_batch_size`; `_ops._to_tensor`; `_tensor._get_array_interface` (the batch size
given as data converted as eager converts an int); `random._draw_state`; `Batch._storage`;
`Batch._invocation_result` and `Tensor._invocation_result` (what a lazy value stands for: a
compiled call's output, or the recorded call of a transparent-mode value);
`TensorList._make_copy`; `TensorListGPU._set_stream`; `_source_analysis.constant_kwargs` and
`_call_site.resolve_callsite_frame` (eager's call-site analysis),
`_invocation.capture_stack_from_frame` (the stack an asynchronous error shows starts at the
script under `python -m ndd_trace`), `_source_analysis`'s
`_get_module_info`, `_file_cache` and `ModuleInfo` (the warm start); `EvalContext._instance_cache`
and the key format of `Operator._get`; `_invocation.Invocation` (the calls a kept error holds,
whose instances stay out of that cache: `invocations_held_by`); `Operator._supported_backends`;
`ops._OperatorInstance`
(its `__init__` wrapped while a per-sample pipeline is defined, and its `_inputs`: the ops the
definition makes, recorded as the IR).

By DALI subsystem, each module importing only those above it: `base` (the DALI objects named
everywhere), `analysis` (DALI's call-site analysis kept across processes), `operators`
(operator facts, eager's split of a call's arguments, its instance keys, metadata inference),
`interception` (ndd calls handed to ndd_trace, watched methods, eval modes),
`data` (Batch/Tensor proxies, data in and out), `random` (generators and their state), `readers`
(epochs, shards, checkpoints), `pipelines` (options, feeding, outputs, DALI's errors read as eager
raises them), `conditionals` (per-sample pipelines). The rest of ndd_trace uses the names below
(`_dali.infer_metadata`, ...); tests/test_dali_surface.py lists every private DALI name used.
"""

from __future__ import annotations

from .analysis import directory as analysis_cache_dir
from .analysis import prefetch as parse_ahead
from .analysis import refuse as refuse_cache_dir
from .analysis import trusted_directory as trusted_cache_dir
from .analysis import set_directory as set_analysis_cache_dir
from .analysis import stats as analysis_cache_stats
from .base import (Batch, batch_of, DALI_VERSION, DType, Device, RNG, STATE_WORDS, Tensor, device,
                   dynamic_module, install_compile)
from .operators import (NOT_PLAIN, SPLIT_VALUES, argument_dtype, argument_names, argument_token,
                        call_site_frame, call_split,
                        data_signature, decay_plain, decay_static, dtype_name, dtype_of,
                        dtype_public_name, eager_instance_key, eager_instance_key_for_batch,
                        eager_split, has_gpu_backend, infer_metadata, input_device,
                        invocations_held_by, is_tensor_argument, keep_eager_instance, meta_of,
                        op_class_at,
                        resolve_backend, tensor_argument, tensor_argument_meta)
from .interception import (interceptor, call_stacks_start_above, capture_running, eager_inside_trace, eager_mode_entered,
                           eval_mode_is_sync, has_side_effects, hold_interception, intercept,
                           is_random, is_stateful,
                           op_functions, op_path, plumbing, process_params_replaced, schema_name,
                           synchronous, synchronous_cpu, tracing_active, unwatched)
from .data import (asks_as_python_data, broadcast_state, concatenated, eager_reads_as_is, host_array, init_proxy,
                   invocation_result_of, lazy_batch, op_function_of, owned_storage,
                   pending_run_of, proxy_device, required_keywords,
                   same_data, sample_range, snapshot, storage_of, tensor_subscript, to_batch, to_tensor,
                   failed_argument, wrap_batch, wrap_tensor, wraps_user_data)
from .random import (ReplayRNG, default_rng, draw_state, existing_default_rng, forget_default_rng,
                     resolve_rng, rng_advance, rng_clone, rng_position, rng_restore, rng_snapshot)
from .readers import (Reader, ReaderFiles, advance_shard, as_eager_read_error, claim_reader,
                      claim_reader_unmapped,
                      cuda_node_meta, eager_epoch_steps, enable_reader_checkpointing, file_path,
                      read_files_again, reader_checkpointing, reader_epoch_captures,
                      reader_epoch_request, reader_files, reader_fn_path, reader_has_tensor_args,
                      reader_metadata, reader_metadata_of, reader_name, reader_shard_id,
                      reader_started, reader_static_args, reader_transferred,
                      reader_uses_batch_size, sample_lengths, sample_sources, set_reader_shard_id,
                      shard_steps, stand_in_batch, transfer_reader, watch_reader_methods,
                      with_samples)
from .pipelines import (ExternalSource, crashes_on_empty_samples, current_device_id,
                        eager_rejects_output_layout,
                        current_num_threads, deferred_error_text, eval_mode_is_deferred, feed,
                        frees_after_failure, has_empty_sample, native_logs_dropped,
                        park_failed_pipeline,
                        pipeline_failure, pipeline_options, pipeline_outputs, schedule_one)
from .conditionals import (MERGE_OP, SPLIT_OP, DefinedOp, array_of, autograph_origin, cast_node, condition_chain,
                           conditional_pipeline, defined_ops, definition_error,
                           do_not_convert, float64_constant,
                           fn_function,
                           host_ints, host_samples, in_this_branch, input_node, is_data_node,
                           logical_hooks, node_key, python_numbers, sample_index_source,
                           sample_indices,
                           scalar_node, shape_node, zero_state)

__all__ = [  # the adapter's names, as the rest of the package uses them
    "advance_shard", "analysis_cache_dir", "as_eager_read_error", "analysis_cache_stats",
    "argument_dtype",
    "argument_names", "argument_token", "array_of", "asks_as_python_data", "autograph_origin", "Batch", "batch_of",
    "cast_node",
    "broadcast_state", "call_site_frame", "call_split", "call_stacks_start_above",
    "capture_running", "concatenated",
    "MERGE_OP", "SPLIT_OP",
    "claim_reader", "claim_reader_unmapped", "condition_chain", "conditional_pipeline",
    "crashes_on_empty_samples", "eager_rejects_output_layout", "DefinedOp", "defined_ops",
    "definition_error",
    "cuda_node_meta", "current_device_id", "current_num_threads", "DALI_VERSION", "data_signature",
    "decay_plain", "decay_static", "default_rng", "deferred_error_text", "Device", "device",
    "do_not_convert", "draw_state", "dynamic_module", "DType", "dtype_name", "dtype_of",
    "dtype_public_name",
    "eager_epoch_steps", "eager_inside_trace", "eager_instance_key", "eager_instance_key_for_batch",
    "eager_mode_entered", "eager_reads_as_is", "eager_split", "enable_reader_checkpointing",
    "eval_mode_is_deferred", "eval_mode_is_sync", "existing_default_rng", "ExternalSource", "feed",
    "file_path", "float64_constant",
    "fn_function", "forget_default_rng", "frees_after_failure", "has_empty_sample",
    "native_logs_dropped",
    "has_gpu_backend", "hold_interception", "host_array", "host_ints", "host_samples",
    "in_this_branch", "infer_metadata", "init_proxy", "input_device", "input_node",
    "install_compile", "intercept", "invocation_result_of", "invocations_held_by", "is_data_node",
    "has_side_effects", "is_random", "is_stateful", "is_tensor_argument", "keep_eager_instance",
    "lazy_batch",
    "logical_hooks", "meta_of", "node_key", "NOT_PLAIN", "op_class_at", "op_function_of",
    "required_keywords",
    "op_functions", "op_path", "owned_storage", "park_failed_pipeline", "pending_run_of",
    "pipeline_failure",
    "pipeline_options", "pipeline_outputs", "plumbing", "process_params_replaced", "proxy_device",
    "sample_range",
    "python_numbers",
    "read_files_again", "Reader", "reader_checkpointing",
    "reader_epoch_captures", "reader_epoch_request", "reader_files", "ReaderFiles",
    "reader_fn_path", "reader_has_tensor_args", "reader_metadata",
    "reader_metadata_of", "reader_name", "reader_shard_id", "reader_started", "reader_static_args",
    "reader_transferred", "reader_uses_batch_size", "refuse_cache_dir", "ReplayRNG",
    "resolve_backend", "resolve_rng",
    "RNG", "rng_advance", "rng_clone", "rng_position", "rng_restore", "rng_snapshot", "same_data",
    "sample_index_source", "sample_indices", "sample_lengths", "sample_sources", "scalar_node",
    "schedule_one", "shape_node",
    "schema_name",
    "parse_ahead", "set_analysis_cache_dir",
    "set_reader_shard_id", "shard_steps", "snapshot", "SPLIT_VALUES", "stand_in_batch",
    "STATE_WORDS", "storage_of",
    "synchronous", "synchronous_cpu", "Tensor", "tensor_argument", "tensor_argument_meta",
    "tensor_subscript", "to_batch", "to_tensor", "tracing_active", "transfer_reader",
    "trusted_cache_dir",
    "unwatched", "watch_reader_methods", "with_samples", "wrap_batch", "wrap_tensor",
    "wraps_user_data", "failed_argument", "zero_state", "interceptor",
]
