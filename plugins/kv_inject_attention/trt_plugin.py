"""TensorRT plugins for KV-injection attention: Python-defined plugins with AOT implementations.

`register_plugin()` defines two plugins with `tensorrt.plugin` (TensorRT >= 10.9; TensorRT-LLM
1.2.1 ships 10.14), both compiled from kernel.py with `triton.compile` at engine build time:

- `trtllm_dflash::kv_inject_attention`: block queries over [context cache ; block].
  Inputs q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale (the scales are
  float32 [1] or [Hkv]; with a non-FP8 cache they are ignored and the insert helper feeds
  constant ones). Attributes (`attention_attrs`): scale (float64 [1], resolved), causal_block
  (bool), window (int32 [1], 0 = no window: attributes cannot be None); 1-element arrays
  rather than float / int, see plugin_spec.ScaleAttr. Output: [B, T, Hq, D] in q's dtype.
- `trtllm_dflash::kv_append`: writes this step's context K/V rows into the caches.
  Inputs k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale; outputs
  k_cache_out, v_cache_out (shaped like the caches) and lens_out = cache_lens + new_lens.
  The kernel writes only the new rows into k_cache_out / v_cache_out: the engine marks them
  as outputs and its runner binds them to the same memory as the k_cache / v_cache inputs
  (TensorRT-LLM's own convention for a contiguous KV cache: runtime/generation.py binds one
  buffer to `past_key_value_{i}` and `present_key_value_{i}`). The attention layer takes
  lens_out as its cache_lens, which orders it after the append.

`@trtp.aot_impl` returns the kernel name, the PTX, the launch grid and the int32 scalar
arguments as symbolic shape expressions. TensorRT embeds the PTX in the engine, so no Python
runs at inference (the C++ Executor and the Triton C++ backend can load it). There is
deliberately no JIT `@trtp.impl`. AOT plugin attributes are not serialized; they only
parameterize the PTX compiled at build time.

What the plugins take and check (ids, inputs, attributes, the kernels' int32 arguments) is in
plugin_spec.py; the compile to PTX and the padding outputs that match TensorRT's launch to the
PTX's parameters are in ptx.py. Both are plain functions tested on CPU; `tensorrt` itself is
imported only inside `register_plugin()` and the insert helpers here.

NOTE: no `from __future__ import annotations` in this file: `tensorrt.plugin` inspects
the decorated functions' annotations as real classes.
"""

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np

from . import checks
from .checks import AttentionProblem, KVInjectArgumentError
from .plugin_spec import (
    APPEND_BLOCK_N,
    APPEND_OUTPUT_NAMES,
    APPEND_PLUGIN_ID,
    APPEND_PLUGIN_NAME,
    PLUGIN_ID,
    ScaleAttr,
    WindowAttr,
    append_plugin_problem,
    append_scalar_args,
    attention_attrs,
    desc_meta,
    itensor_meta,
    plugin_problem,
    require_static_scales,
    scalar_args,
)
from .ptx import CompiledKernel, check_launch_abi, compile_append_kernel, compile_attention_kernel, triton_extra_params

_ONE = np.ones(1, dtype=np.float32)  # scale input for non-FP8 caches; TensorRT keeps a pointer to it


@dataclass(frozen=True)
class Plugins:
    """The registered plugins' `trtp.op` entry points, and the padding outputs each declares."""

    attention: object
    append: object
    padding: int


_REGISTERED: Optional[Plugins] = None


def _attr_value(name: str, value) -> Union[int, float]:
    """A 1-element array attribute as a Python number."""
    array = np.asarray(value)
    if array.shape != (1,):
        raise KVInjectArgumentError(f"{PLUGIN_ID}: attribute {name} must be a 1-element array, got shape "
                                    f"{array.shape}")
    return array.item()


def _attention_problem(descs, scale, causal_block: bool, window) -> AttentionProblem:
    return plugin_problem([desc_meta(d) for d in descs], _attr_value("scale", scale), causal_block,
                          _attr_value("window", window))


def _outputs(n: int):
    """The return annotation of a descriptor with n outputs (tensorrt.plugin counts its arguments)."""
    import tensorrt.plugin as trtp

    return Tuple[tuple([trtp.TensorDesc] * n)]


def _launch(trtp, compiled: CompiledKernel, grid_x, grid_y, scalar_exprs: list):
    """KernelLaunchParams and the int32 extra arguments (SymIntExprs of SymInt32) for the AOT impl."""
    launch = trtp.KernelLaunchParams()
    launch.grid_x, launch.grid_y = grid_x, grid_y
    launch.block_x = compiled.num_warps * 32
    launch.shared_mem = compiled.shared_mem
    return launch, trtp.SymIntExprs.from_tuple([trtp.SymInt32(a) for a in scalar_exprs])


def _register_attention(trtp, pad: int, target) -> None:
    """trtp.register / trtp.aot_impl of trtllm_dflash::kv_inject_attention (outputs: out, padding)."""

    def kv_inject_attention_desc(
        q: trtp.TensorDesc, k_block: trtp.TensorDesc, v_block: trtp.TensorDesc, k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc, cache_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        scale: ScaleAttr, causal_block: bool, window: WindowAttr,
    ):
        _attention_problem((q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale), scale,
                           causal_block, window)
        return (q.like(), *[cache_lens.like() for _ in range(pad)])  # out [B, T, Hq, D] in q's dtype; padding

    kv_inject_attention_desc.__annotations__["return"] = _outputs(1 + pad)
    trtp.register(PLUGIN_ID)(kv_inject_attention_desc)

    @trtp.aot_impl(PLUGIN_ID)
    def kv_inject_attention_aot(
        q: trtp.TensorDesc, k_block: trtp.TensorDesc, v_block: trtp.TensorDesc, k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc, cache_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        scale: ScaleAttr, causal_block: bool, window: WindowAttr, outputs: Tuple[trtp.TensorDesc], tactic: int,
    ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymIntExprs]:
        p = _attention_problem((q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale), scale,
                               causal_block, window)
        if p.cache_dtype == checks.FP8_CACHE_DTYPE:
            require_static_scales(PLUGIN_ID, desc_meta(k_scale), desc_meta(v_scale))
        compiled = compile_attention_kernel(p, target)
        check_launch_abi(PLUGIN_ID, compiled, pad)
        B, T, S = q.shape_expr[0], q.shape_expr[1], k_cache.shape_expr[1]
        args = scalar_args(B, T, S, p.num_q_heads, p.num_kv_heads, p.head_dim, bool(p.kv_scale_per_head))
        # one program per (sequence, KV head) and BLOCK_M query rows (t, head in group)
        launch, extra = _launch(trtp, compiled, B * p.num_kv_heads, trtp.cdiv(T * p.group_size, compiled.block_m),
                                args)
        return compiled.name, compiled.ptx, launch, extra


def _register_append(trtp, pad: int, target) -> None:
    """trtp.register / trtp.aot_impl of trtllm_dflash::kv_append (outputs: caches, lens, padding)."""

    def kv_append_desc(
        k_cache: trtp.TensorDesc, v_cache: trtp.TensorDesc, k_new: trtp.TensorDesc, v_new: trtp.TensorDesc,
        cache_lens: trtp.TensorDesc, new_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
    ):
        descs = (k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
        append_plugin_problem([desc_meta(d) for d in descs])
        return (k_cache.like(), v_cache.like(), cache_lens.like(), *[cache_lens.like() for _ in range(pad)])

    kv_append_desc.__annotations__["return"] = _outputs(len(APPEND_OUTPUT_NAMES) + pad)
    trtp.register(APPEND_PLUGIN_ID)(kv_append_desc)

    @trtp.aot_impl(APPEND_PLUGIN_ID)
    def kv_append_aot(
        k_cache: trtp.TensorDesc, v_cache: trtp.TensorDesc, k_new: trtp.TensorDesc, v_new: trtp.TensorDesc,
        cache_lens: trtp.TensorDesc, new_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        outputs: Tuple[trtp.TensorDesc], tactic: int,
    ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymIntExprs]:
        descs = (k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
        p = append_plugin_problem([desc_meta(d) for d in descs])
        if p.cache_dtype == checks.FP8_CACHE_DTYPE:
            require_static_scales(APPEND_PLUGIN_ID, desc_meta(k_scale), desc_meta(v_scale))
        compiled = compile_append_kernel(p, target)
        check_launch_abi(APPEND_PLUGIN_ID, compiled, pad)
        B, N, S = k_new.shape_expr[0], k_new.shape_expr[1], k_cache.shape_expr[1]
        args = append_scalar_args(N, S, p.num_kv_heads, p.head_dim, bool(p.kv_scale_per_head))
        # one program per (sequence, KV head, APPEND_BLOCK_N new rows)
        launch, extra = _launch(trtp, compiled, B * p.num_kv_heads, trtp.cdiv(N, APPEND_BLOCK_N), args)
        return compiled.name, compiled.ptx, launch, extra


def register_plugin(target=None) -> Plugins:
    """Define both plugins with tensorrt.plugin (idempotent). `target`: the triton GPUTarget the
    engine is built for (None: the current GPU), which fixes the padding outputs.

    Upstream (TensorRT 10.14, tensorrt/plugin/): _lib.py `register` (the number of outputs is
    read from the descriptor's return annotation, `_validate.py::_parse_register_return`) and
    `aot_impl` (returns kernel name, PTX, KernelLaunchParams, SymIntExprs; "extra_args ...
    located after the tensor inputs and before the tensor outputs"). _plugin_class.py calls the
    descriptor function with "fake" dims (dtype inference), then with shape expressions, and
    the aot_impl with all attributes positionally, in the order `trtp.op` received them."""
    global _REGISTERED
    if _REGISTERED is not None:
        return _REGISTERED
    import tensorrt.plugin as trtp

    if not hasattr(trtp, "aot_impl"):
        raise NotImplementedError(f"{PLUGIN_ID} needs TensorRT >= 10.9 (tensorrt.plugin.aot_impl); "
                                  "this TensorRT has no AOT Python plugins")
    pad = triton_extra_params(target)
    _register_attention(trtp, pad, target)
    _register_append(trtp, pad, target)
    ops = trtp.op.trtllm_dflash
    _REGISTERED = Plugins(ops.kv_inject_attention, getattr(ops, APPEND_PLUGIN_NAME), pad)
    return _REGISTERED


def _scales(network, k_scale, v_scale):
    """Constant ones for a non-FP8 cache: INetworkDefinition.add_constant(shape, tensorrt.Weights)
    (TensorRT keeps a pointer to the array)."""
    import tensorrt as trt

    if k_scale is None:
        k_scale = v_scale = network.add_constant((1,), trt.Weights(_ONE)).get_output(0)
    return k_scale, v_scale


def insert_kv_inject_attention(
    network,  # tensorrt.INetworkDefinition (strongly typed)
    q, k_block, v_block, k_cache, v_cache, cache_lens,  # tensorrt.ITensor, layouts as in the torch op
    *,
    scale: Optional[float] = None,
    causal_block: bool = False,
    window: Optional[int] = None,
    k_scale=None,  # tensorrt.ITensor float32 [1] or [Hkv], with a float8 cache
    v_scale=None,
):
    """Add the attention plugin layer to `network`; returns the layer (output 0: [B, T, Hq, D];
    the others are ABI padding).

    Arguments are checked here, at network construction, with the same messages as the
    torch op, instead of surfacing later from inside TensorRT's build callbacks.
    Upstream: `INetworkDefinition.add_plugin(..., aot=True)` (TensorRT 10.14,
    samples/python/quickly_deployable_plugins/qdp_runner.py).
    """
    metas = [itensor_meta(t) for t in (q, k_block, v_block, k_cache, v_cache, cache_lens)]
    problem = checks.check_attention(
        *metas, scale=scale, causal_block=causal_block, window=window,
        k_scale=None if k_scale is None else itensor_meta(k_scale),
        v_scale=None if v_scale is None else itensor_meta(v_scale))
    reason = checks.kernel_unsupported_reason(problem)
    if reason is not None:
        raise KVInjectArgumentError(f"{PLUGIN_ID}: {reason}")
    if k_scale is not None:
        require_static_scales(PLUGIN_ID, itensor_meta(k_scale), itensor_meta(v_scale))
    k_scale, v_scale = _scales(network, k_scale, v_scale)
    op = register_plugin().attention
    plugin = op(q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale,
                **attention_attrs(float(problem.scale), causal_block, window))
    return network.add_plugin(plugin, aot=True)


def insert_kv_append(network, k_cache, v_cache, k_new, v_new, cache_lens, new_lens, *, k_scale=None, v_scale=None):
    """Add the append plugin layer to `network`; returns the layer (outputs k_cache_out,
    v_cache_out, lens_out, then ABI padding). Checked at network construction like the torch op.
    Upstream: `INetworkDefinition.add_plugin(..., aot=True)` (TensorRT 10.14)."""
    metas = [itensor_meta(t) for t in (k_cache, v_cache, k_new, v_new, cache_lens, new_lens)]
    problem = checks.check_append(*metas, k_scale=None if k_scale is None else itensor_meta(k_scale),
                                  v_scale=None if v_scale is None else itensor_meta(v_scale))
    reason = checks.append_kernel_unsupported_reason(problem)
    if reason is not None:
        raise KVInjectArgumentError(f"{APPEND_PLUGIN_ID}: {reason}")
    if k_scale is not None:
        require_static_scales(APPEND_PLUGIN_ID, itensor_meta(k_scale), itensor_meta(v_scale))
    k_scale, v_scale = _scales(network, k_scale, v_scale)
    plugin = register_plugin().append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
    return network.add_plugin(plugin, aot=True)


def kv_inject_attention_trtllm(q, k_block, v_block, k_cache, v_cache, cache_lens, *, scale=None,
                               causal_block=False, window=None, k_scale=None, v_scale=None):
    """The attention plugin inside a TensorRT-LLM 1.2 network: takes and returns
    tensorrt_llm.functional.Tensor.

    Call inside a model's forward (under net_guard); the engine backend's drafter uses this
    in place of its attention core. TensorRT-LLM networks are strongly typed: cast inputs first.
    Upstream: `tensorrt_llm._common.default_trtnet`, `tensorrt_llm.functional._create_tensor`
    (tensorrt_llm/_common.py, tensorrt_llm/functional.py).
    """
    from tensorrt_llm._common import default_trtnet
    from tensorrt_llm.functional import _create_tensor

    unwrap = lambda t: None if t is None else t.trt_tensor  # noqa: E731
    layer = insert_kv_inject_attention(
        default_trtnet(), *(t.trt_tensor for t in (q, k_block, v_block, k_cache, v_cache, cache_lens)),
        scale=scale, causal_block=causal_block, window=window, k_scale=unwrap(k_scale), v_scale=unwrap(v_scale))
    return _create_tensor(layer.get_output(0), layer)


def kv_append_trtllm(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, *, k_scale=None, v_scale=None):
    """The append plugin inside a TensorRT-LLM 1.2 network: (k_cache_out, v_cache_out, lens_out)
    as tensorrt_llm.functional.Tensor. Upstream: as kv_inject_attention_trtllm."""
    from tensorrt_llm._common import default_trtnet
    from tensorrt_llm.functional import _create_tensor

    unwrap = lambda t: None if t is None else t.trt_tensor  # noqa: E731
    layer = insert_kv_append(default_trtnet(), *(t.trt_tensor for t in (k_cache, v_cache, k_new, v_new, cache_lens,
                                                                        new_lens)),
                             k_scale=unwrap(k_scale), v_scale=unwrap(v_scale))
    return tuple(_create_tensor(layer.get_output(i), layer) for i in range(len(APPEND_OUTPUT_NAMES)))
