"""What the two TensorRT plugins take, checked without TensorRT: their ids and inputs, the
attention plugin's attributes, tensor descriptors as checks.py TensorMeta, the argument checks
and the kernels' int32 arguments.

trt_plugin.py registers and inserts the plugins; ptx.py compiles their kernels. Everything here
is a plain function tested on CPU: `tensorrt` is never imported, descriptors and network tensors
are read by attribute.
"""

from typing import Optional, Sequence

import numpy as np
import numpy.typing as npt

from . import checks
from .checks import AppendProblem, AttentionProblem, KVInjectArgumentError, TensorMeta

PLUGIN_NAMESPACE = "trtllm_dflash"
PLUGIN_NAME = "kv_inject_attention"
PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{PLUGIN_NAME}"
INPUT_NAMES = ("q", "k_block", "v_block", "k_cache", "v_cache", "cache_lens", "k_scale", "v_scale")
APPEND_PLUGIN_NAME = "kv_append"
APPEND_PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{APPEND_PLUGIN_NAME}"
APPEND_INPUT_NAMES = ("k_cache", "v_cache", "k_new", "v_new", "cache_lens", "new_lens", "k_scale", "v_scale")
APPEND_OUTPUT_NAMES = ("k_cache_out", "v_cache_out", "lens_out")
APPEND_BLOCK_N = 16  # new rows per program (kernel._append_context_fwd)

# tensorrt.DataType member name -> checks.py dtype name
_TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "FP8": "float8_e4m3fn",
               "INT32": "int32", "INT64": "int64", "INT8": "int8", "BOOL": "bool", "UINT8": "uint8"}


# Attribute types. scale and window travel as 1-element numpy arrays, not as float / int:
# TensorRT 10.14's tensorrt.plugin rebuilds a scalar attribute with `float(field.data)` /
# `int(field.data)` on a 1-element array (tensorrt/plugin/_lib.py,
# _TemplatePluginCreator.create_plugin; unchanged on TensorRT main), a NumPy 1.25 deprecation
# that NumPy 2.4 turned into "TypeError: only 0-dimensional arrays can be converted to Python
# scalars" (hit by a QDP plugin's int attribute in
# https://github.com/Stability-AI/stable-audio-3/pull/49). Array attributes are rebuilt with
# `astype`, on every NumPy. bool(1-element array) is not deprecated: causal_block stays a bool.
ScaleAttr = npt.NDArray[np.float64]
WindowAttr = npt.NDArray[np.int32]


def dtype_name(trt_dtype) -> str:
    """tensorrt.DataType -> "float16", "float8_e4m3fn", ... (by member name, no tensorrt import)."""
    name = getattr(trt_dtype, "name", str(trt_dtype).split(".")[-1])
    return _TRT_DTYPES.get(name, name.lower())


def desc_meta(desc) -> TensorMeta:
    """TensorMeta of a tensorrt.plugin.TensorDesc: constant dims known, symbolic or fake ones None."""
    dims = []
    for expr in desc.shape_expr:
        known = not expr.is_fake and expr.is_constant
        dims.append(expr.constant_value() if known else None)
    return TensorMeta(tuple(dims), dtype_name(desc.dtype))


def itensor_meta(tensor) -> TensorMeta:
    """TensorMeta of a network tensor (tensorrt.ITensor): -1 (dynamic) dims become None."""
    return TensorMeta(tuple(None if d < 0 else int(d) for d in tensor.shape), dtype_name(tensor.dtype))


def _check_scales(plugin_id: str, k_scale: TensorMeta, v_scale: TensorMeta) -> None:
    """The plugins always take k_scale / v_scale inputs (TensorRT plugins have fixed inputs)."""
    for name, m in (("k_scale", k_scale), ("v_scale", v_scale)):
        if m.dtype != checks.SCALE_DTYPE or len(m.shape) != 1:
            raise KVInjectArgumentError(f"{plugin_id}: plugin input {name} must be a float32 [1] or [Hkv] tensor "
                                        f"(constant ones with a non-FP8 cache), got {m.dtype} {m.shape}")


def plugin_problem(metas: Sequence[TensorMeta], scale: float, causal_block: bool, window: int) -> AttentionProblem:
    """Check the plugin's 8 inputs and 3 attributes with checks.py; raises KVInjectArgumentError."""
    if len(metas) != len(INPUT_NAMES):
        raise KVInjectArgumentError(f"{PLUGIN_ID}: expected {len(INPUT_NAMES)} inputs {INPUT_NAMES}, got {len(metas)}")
    q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale = metas
    _check_scales(PLUGIN_ID, k_scale, v_scale)
    fp8 = k_cache.dtype == checks.FP8_CACHE_DTYPE
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise KVInjectArgumentError(f"{PLUGIN_ID}: window attribute = {window!r}; must be an int >= 1, or 0 for none")
    return checks.check_attention(
        q, k_block, v_block, k_cache, v_cache, cache_lens, scale=scale, causal_block=causal_block,
        window=window or None, k_scale=k_scale if fp8 else None, v_scale=v_scale if fp8 else None)


def scalar_args(B, T, S, num_q_heads: int, num_kv_heads: int, head_dim: int, scale_per_head: bool) -> list:
    """The kernel's int32 arguments for packed (contiguous) tensors, in signature order.

    B, T, S may be ints or TensorRT shape expressions (kept as the left operand, since
    shape expressions define `*` but not its reflection); the head counts are ints.
    """
    q_strides = [T * (num_q_heads * head_dim), num_q_heads * head_dim, head_dim]  # [B, T, Hq, D]
    block_strides = [T * (num_kv_heads * head_dim), num_kv_heads * head_dim, head_dim]  # [B, T, Hkv, D]
    cache_strides = [S * (num_kv_heads * head_dim), num_kv_heads * head_dim, head_dim]  # [B, S_max, Hkv, D]
    return [T, S, num_kv_heads, 1 if scale_per_head else 0,
            *q_strides, *block_strides, *block_strides, *cache_strides, *cache_strides, *q_strides]


def append_plugin_problem(metas: Sequence[TensorMeta]) -> AppendProblem:
    """Check the append plugin's 8 inputs with checks.py; raises KVInjectArgumentError.

    Unknown dims (None) pass, as in plugin_problem: TensorRT's dtype-inference pass hands the
    descriptor function "fake" dims only (tensorrt/plugin/_plugin_class.py
    `_TemplatePluginBase.get_output_data_types`, TensorRT 10.14). What the kernel needs static
    (Hkv, D) is checked where it is compiled (compile_append_kernel)."""
    if len(metas) != len(APPEND_INPUT_NAMES):
        raise KVInjectArgumentError(f"{APPEND_PLUGIN_ID}: expected {len(APPEND_INPUT_NAMES)} inputs "
                                    f"{APPEND_INPUT_NAMES}, got {len(metas)}")
    k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale = metas
    _check_scales(APPEND_PLUGIN_ID, k_scale, v_scale)
    fp8 = k_cache.dtype == checks.FP8_CACHE_DTYPE
    return checks.check_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens,
                               k_scale=k_scale if fp8 else None, v_scale=v_scale if fp8 else None)


def append_scalar_args(N, S, num_kv_heads: int, head_dim: int, scale_per_head: bool) -> list:
    """The append kernel's int32 arguments for packed tensors, in signature order
    (kernel._append_context_aot): NUM_KV_HEADS, SCALE_STRIDE, then the batch / row / head strides
    of k_cache, v_cache (= of the outputs), k_new, v_new. N, S may be shape expressions."""
    row = num_kv_heads * head_dim
    cache_strides = [S * row, row, head_dim]  # [B, S_max, Hkv, D]
    new_strides = [N * row, row, head_dim]  # [B, N, Hkv, D]
    return [num_kv_heads, 1 if scale_per_head else 0, *cache_strides, *cache_strides, *new_strides, *new_strides]


def attention_attrs(scale: float, causal_block: bool, window: Optional[int]) -> dict:
    """The attention plugin's attributes, in registration order, as `trtp.op` takes them."""
    return dict(scale=np.array([scale], dtype=np.float64), causal_block=bool(causal_block),
                window=np.array([window or 0], dtype=np.int32))


def require_static_scales(plugin_id: str, k_scale: TensorMeta, v_scale: TensorMeta) -> None:
    """An FP8 kernel is compiled for per-tensor ([1]) or per-KV-head ([Hkv]) scales; a scale whose
    length is only known at run time could be either (checks.py would take it for per-head and
    the kernel would read Hkv entries of a [1] buffer)."""
    for name, m in (("k_scale", k_scale), ("v_scale", v_scale)):
        if any(d is None for d in m.shape):
            raise KVInjectArgumentError(f"{plugin_id}: {name} has a dynamic shape {m.shape}; an FP8 cache needs a "
                                        "static [1] (per tensor) or [Hkv] (per KV head) scale")
